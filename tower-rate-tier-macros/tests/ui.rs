//! Compile-fail and compile-pass cases of the macros (trybuild).
//!
//! The `.stderr` snapshots depend on the compiler version; regenerate them
//! with `TRYBUILD=overwrite cargo test -p tower-rate-tier-macros --test ui`
//! and read every one: each must hold only the intended error(s).

#[test]
fn ui() {
    let cases = trybuild::TestCases::new();
    cases.pass("tests/ui/pass/*.rs");
    cases.compile_fail("tests/ui/fail/*.rs");
}
