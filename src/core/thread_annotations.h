// Clang thread-safety annotations (-Wthread-safety). They expand to nothing on other compilers;
// CI compiles the sources with clang to check them.
#pragma once

#if defined(__clang__)
#define KVTIER_THREAD_ANNOTATION_(x) __attribute__((x))
#else
#define KVTIER_THREAD_ANNOTATION_(x)
#endif

#define CAPABILITY(x) KVTIER_THREAD_ANNOTATION_(capability(x))
#define SCOPED_CAPABILITY KVTIER_THREAD_ANNOTATION_(scoped_lockable)
#define GUARDED_BY(x) KVTIER_THREAD_ANNOTATION_(guarded_by(x))
#define PT_GUARDED_BY(x) KVTIER_THREAD_ANNOTATION_(pt_guarded_by(x))
#define ACQUIRED_BEFORE(...) KVTIER_THREAD_ANNOTATION_(acquired_before(__VA_ARGS__))
#define ACQUIRED_AFTER(...) KVTIER_THREAD_ANNOTATION_(acquired_after(__VA_ARGS__))
#define REQUIRES(...) KVTIER_THREAD_ANNOTATION_(requires_capability(__VA_ARGS__))
#define ACQUIRE(...) KVTIER_THREAD_ANNOTATION_(acquire_capability(__VA_ARGS__))
#define RELEASE(...) KVTIER_THREAD_ANNOTATION_(release_capability(__VA_ARGS__))
#define TRY_ACQUIRE(...) KVTIER_THREAD_ANNOTATION_(try_acquire_capability(__VA_ARGS__))
#define EXCLUDES(...) KVTIER_THREAD_ANNOTATION_(locks_excluded(__VA_ARGS__))
#define NO_THREAD_SAFETY_ANALYSIS KVTIER_THREAD_ANNOTATION_(no_thread_safety_analysis)
