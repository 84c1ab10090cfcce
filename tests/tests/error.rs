//! `Error::arg`: every invalid-input error names its argument; device and driver errors name none.
use rgk::Error;

#[test]
fn arg_names_the_argument_of_invalid_input() {
    assert_eq!(Error::Shape { arg: "n", msg: "not a power of two".into() }.arg(), Some("n"));
    assert_eq!(Error::BufferTooSmall { arg: "x_res", needed: 8, got: 4 }.arg(), Some("x_res"));
    assert_eq!(Error::Overflow { arg: "batch", msg: "n·batch".into() }.arg(), Some("batch"));
    assert_eq!(Error::NoDevice("no driver".into()).arg(), None);
    assert_eq!(Error::MissingKernel("fft".into()).arg(), None);
}

/// The shape checks that run before any device work name the argument through `arg()` too.
#[test]
fn shape_errors_name_their_argument() {
    let e = rgk::mhc::MhcPreShape::from_phi(2, 8, 7).unwrap_err();
    assert_eq!(e.arg(), Some("phi"));
    let e = rgk::mhc::MhcPostShape { batch: 0, n: 4, c: 8 }.lens().unwrap_err();
    assert_eq!(e.arg(), Some("batch"));
}
