//! The tuning variables of the HIP backend (`DS4_HIP_*`, `DS4_LOAD_*`): one reader for a number
//! from the environment, so each variable states only its range and what it counts, and a malformed
//! value is always the same one-line error. Depends on nothing else in the backend.

use std::str::FromStr;

/// `name` parsed as a `T` that `accept` takes: `None` when unset, else the value or
/// "NAME=VALUE: expected EXPECTED" (surrounding white space ignored).
pub fn env_number<T: FromStr>(name: &str, accept: impl Fn(&T) -> bool, expected: &str) -> Result<Option<T>, String> {
    match std::env::var(name) {
        Err(_) => Ok(None),
        Ok(s) => match s.trim().parse::<T>() {
            Ok(n) if accept(&n) => Ok(Some(n)),
            _ => Err(format!("{name}={s}: expected {expected}")),
        },
    }
}

/// Whether the switch `name` is on: unset or any value but `0` (the switches that turn a default
/// mechanism off, such as `DS4_HIP_GRAPH` and `DS4_HIP_LANES`).
pub fn env_switch_on(name: &str) -> bool {
    std::env::var(name).map_or(true, |v| v.trim() != "0")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unset_accepted_and_refused_values() {
        // A name no test sets.
        let name = "DS4_HIP_ENV_NUMBER_TEST_UNSET";
        assert_eq!(env_number::<u32>(name, |_| true, "a count"), Ok(None));
        let name = "DS4_HIP_ENV_NUMBER_TEST";
        // SAFETY: this test alone reads or writes this variable.
        unsafe { std::env::set_var(name, " 12 ") };
        assert_eq!(env_number::<u32>(name, |&n| n > 0, "a positive count"), Ok(Some(12)));
        assert_eq!(
            env_number::<u32>(name, |&n| n > 20, "more than 20"),
            Err(format!("{name}= 12 : expected more than 20"))
        );
        unsafe { std::env::set_var(name, "x") };
        assert_eq!(
            env_number::<usize>(name, |_| true, "a count"),
            Err(format!("{name}=x: expected a count"))
        );
        unsafe { std::env::remove_var(name) };
    }

    #[test]
    fn a_switch_is_off_only_at_zero() {
        let name = "DS4_HIP_ENV_SWITCH_TEST";
        assert!(env_switch_on(name), "unset");
        for (v, on) in [("0", false), (" 0 ", false), ("1", true), ("", true), ("off", true)] {
            // SAFETY: this test alone reads or writes this variable.
            unsafe { std::env::set_var(name, v) };
            assert_eq!(env_switch_on(name), on, "{name}={v:?}");
        }
        unsafe { std::env::remove_var(name) };
    }
}
