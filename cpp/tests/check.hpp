// A tiny test runner for the C++ unit tests (no gtest): TEST(name) registers a function,
// CHECK(cond) records a failure with its location and returns from the test, and
// run_all_tests() runs everything and returns the process exit code.
#pragma once

#include <cstdio>
#include <exception>
#include <functional>
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

inline int run_all_tests() {
    int failed = 0;
    for (const Case& c : registry()) {
        bool ok = true;
        try {
            c.body(ok);
        } catch (const std::exception& e) {
            std::fprintf(stderr, "  exception: %s\n", e.what());
            ok = false;
        }
        std::fprintf(stderr, "%s %s\n", ok ? "PASS" : "FAIL", c.name);
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
