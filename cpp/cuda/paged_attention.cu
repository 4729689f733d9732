// placeholder until the CUDA kernels land
namespace pagedserve {}
