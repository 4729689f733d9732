// A tiny test runner for the C++ unit tests (no gtest): TEST(name) registers a function,
// CHECK(cond) records a failure with its location and returns from the test, and
// run_all_tests() runs everything (but the tests CHECK_SKIP names, comma-separated: what an
// emulated run need not repeat) and returns the process exit code; each line gives the test's
// wall time.
#pragma once

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace check {

struct Case {
    const char* name;
    std::function<void(bool&)> body;  // sets the flag to false on a failed CHECK
};

inline std::vector<Case>& registry() {
    static std::vector<Case> cases;
    return cases;
}

struct Registrar {
    Registrar(const char* name, std::function<void(bool&)> body) {
        registry().push_back({name, std::move(body)});
    }
};

// Whether CHECK_SKIP (comma-separated test names) names `name`.
inline bool skipped(const char* name) {
    const char* list = std::getenv("CHECK_SKIP");
    if (list == nullptr) return false;
    const std::string names = std::string(",") + list + ",";
    return names.find(std::string(",") + name + ",") != std::string::npos;
}

inline int run_all_tests() {
    int failed = 0;
    for (const Case& c : registry()) {
        if (skipped(c.name)) {
            std::fprintf(stderr, "SKIP %s (CHECK_SKIP)\n", c.name);
            continue;
        }
        bool ok = true;
        const auto start = std::chrono::steady_clock::now();
        try {
            c.body(ok);
        } catch (const std::exception& e) {
            std::fprintf(stderr, "  exception: %s\n", e.what());
            ok = false;
        }
        const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
        std::fprintf(stderr, "%s %s (%.2f s)\n", ok ? "PASS" : "FAIL", c.name, took.count());
        failed += ok ? 0 : 1;
    }
    std::fprintf(stderr, "%zu tests, %d failed\n", registry().size(), failed);
    return failed == 0 ? 0 : 1;
}

}  // namespace check

#define CHECK_CONCAT_(a, b) a##b
#define CHECK_CONCAT(a, b) CHECK_CONCAT_(a, b)

#define TEST(name)                                                                    \
    static void name(bool& check_ok_);                                                \
    static check::Registrar CHECK_CONCAT(check_registrar_, name)(#name, name);        \
    static void name(bool& check_ok_)

#define CHECK(cond)                                                                    \
    do {                                                                               \
        if (!(cond)) {                                                                 \
            std::fprintf(stderr, "  %s:%d: CHECK(%s) failed\n", __FILE__, __LINE__, #cond); \
            check_ok_ = false;                                                         \
            return;                                                                    \
        }                                                                              \
    } while (0)

// Expects `expr` to throw an exception of type `type`.
#define CHECK_THROWS(type, expr)                                                       \
    do {                                                                               \
        bool threw_ = false;                                                           \
        try {                                                                          \
            (void)(expr);                                                              \
        } catch (const type&) {                                                        \
            threw_ = true;                                                             \
        }                                                                              \
        CHECK(threw_ && #expr " throws " #type);                                       \
    } while (0)
