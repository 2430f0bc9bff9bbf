//! The message of a caught panic, for the parallelizer and the tokio runner.

use std::any::Any;

/// The message of a caught panic's payload (`&str` or `String`; a placeholder otherwise).
pub fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&'static str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic payload that is not a string".to_owned()
    }
}
