//! Durations as messages show them. A leaf module: the registry and the tools both
//! use it, and it uses neither.

use std::time::Duration;

/// A deadline as people write it: `3s`, or `1500ms` when not whole seconds.
pub(crate) fn describe_duration(duration: Duration) -> String {
    if duration.as_millis().is_multiple_of(1000) {
        format!("{}s", duration.as_secs())
    } else {
        format!("{}ms", duration.as_millis())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_seconds_and_milliseconds() {
        assert_eq!(describe_duration(Duration::from_secs(3)), "3s");
        assert_eq!(describe_duration(Duration::from_millis(1500)), "1500ms");
    }
}
