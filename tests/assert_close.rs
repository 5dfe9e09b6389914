//! The rules of the tests' `assert_close`: a tolerance never lets a NaN or a wrong infinity pass.

mod common;

use common::assert_close;

#[test]
fn equal_finite_and_infinite_values_pass() {
    assert_close(
        "ok",
        &[1.0, f32::INFINITY, f32::NEG_INFINITY],
        &[1.0 + 1e-7, f32::INFINITY, f32::NEG_INFINITY],
        1e-6,
        0.0,
    );
}
#[test]
#[should_panic(expected = "NaN")]
fn nan_against_nan_fails() {
    assert_close("nan", &[f32::NAN], &[f32::NAN], 1.0, 1.0);
}
#[test]
#[should_panic(expected = "NaN")]
fn nan_against_inf_fails() {
    assert_close("nan", &[f32::NAN], &[f32::INFINITY], 1.0, 1.0);
}
#[test]
#[should_panic(expected = "inf vs -inf")]
fn opposite_infinities_fail() {
    assert_close("inf", &[f32::INFINITY], &[f32::NEG_INFINITY], 1.0, 1.0);
}
#[test]
#[should_panic(expected = "vs")]
fn infinity_against_a_number_fails() {
    assert_close("inf", &[f32::INFINITY], &[1e30], 1.0, 1.0);
}
