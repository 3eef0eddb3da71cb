//! Byte quantities for people: the one formatter every layer uses (binary units, KiB = 1024 B).
//!
//! Owns the unit constants and the text forms. The bottom layer (src/lib.rs): imports nothing from
//! the crate, so every other module can use it.

pub const KIB: u64 = 1 << 10;
pub const MIB: u64 = 1 << 20;
pub const GIB: u64 = 1 << 30;
pub const TIB: u64 = 1 << 40;

/// `b` in GiB, for figures computed further (rates, gauges).
pub fn gib(b: u64) -> f64 {
    b as f64 / GIB as f64
}

/// `b` with the largest unit that keeps the value at least 1, one decimal: "81.5 GiB", "3.0 MiB",
/// "512 B".
pub fn fmt_bytes(b: u64) -> String {
    let units = [(TIB, "TiB"), (GIB, "GiB"), (MIB, "MiB"), (KIB, "KiB")];
    match units.iter().find(|(size, _)| b >= *size) {
        Some(&(size, name)) => format!("{:.1} {name}", b as f64 / size as f64),
        None => format!("{b} B"),
    }
}

/// `b` in GiB with `decimals` decimals, for columns and messages that keep one unit: "0.5 GiB".
pub fn fmt_gib(b: u64, decimals: usize) -> String {
    format!("{:.decimals$} GiB", gib(b))
}

/// `b` for memory-guard messages: GiB with two decimals from 1 GiB, else MiB with one: "80.76 GiB",
/// "25.2 MiB".
pub fn fmt_mib_or_gib(b: u64) -> String {
    if b >= GIB {
        fmt_gib(b, 2)
    } else {
        format!("{:.1} MiB", b as f64 / MIB as f64)
    }
}

/// "done/total UNIT" for progress, the unit chosen by the total (GiB from 1 GiB, else MiB).
pub fn fmt_bytes_pair(done: u64, total: u64) -> String {
    let (unit, name) = if total >= GIB { (GIB, "GiB") } else { (MIB, "MiB") };
    let in_unit = |b: u64| b as f64 / unit as f64;
    format!("{:.1}/{:.1} {name}", in_unit(done), in_unit(total))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_the_largest_unit_at_least_one() {
        assert_eq!(fmt_bytes(81 * GIB + 512 * MIB), "81.5 GiB");
        assert_eq!(fmt_bytes(3 * MIB), "3.0 MiB");
        assert_eq!(fmt_bytes(1536), "1.5 KiB");
        assert_eq!(fmt_bytes(1023), "1023 B");
        assert_eq!(fmt_bytes(12_800_000_000_512), "11.6 TiB");
        assert_eq!(fmt_gib(GIB / 2, 1), "0.5 GiB");
        assert_eq!(fmt_gib(81 * GIB, 2), "81.00 GiB");
        assert_eq!(gib(3 * GIB), 3.0);
        assert_eq!(fmt_bytes_pair(GIB / 2, 3 * GIB), "0.5/3.0 GiB");
        assert_eq!(fmt_bytes_pair(MIB, 4 * MIB), "1.0/4.0 MiB");
        assert_eq!(fmt_mib_or_gib(3 * GIB + GIB / 4), "3.25 GiB");
        assert_eq!(fmt_mib_or_gib(GIB - MIB), "1023.0 MiB");
    }
}
