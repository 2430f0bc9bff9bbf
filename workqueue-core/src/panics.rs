//! The message of a caught panic: what [`ParallelizeError`](crate::ParallelizeError) and the
//! tokio runner's `Failure::Panic` carry.

use std::any::Any;

/// The message of a caught panic's payload (what `std::panic::catch_unwind` returns): the
/// `&str` or `String` given to `panic!`, or a placeholder for any other payload. The messages of
/// the panics this workspace catches in user code are made by this function.
///
/// ```
/// let payload = std::panic::catch_unwind(|| panic!("key {} is invalid", 7)).unwrap_err();
/// assert_eq!(workqueue_core::panic_message(&*payload), "key 7 is invalid");
/// ```
pub fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&'static str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic payload that is not a string".to_owned()
    }
}
