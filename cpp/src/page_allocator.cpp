// placeholder until the page allocator lands
namespace pagedserve {}
