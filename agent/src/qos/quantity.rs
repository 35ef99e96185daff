//! A parser for Kubernetes resource quantities (`resource.Quantity`): `"100m"`, `"0.5"`,
//! `"128Mi"`, `"1G"`, `"1e3"`.
//!
//! Grammar (as in apimachinery):
//!
//! ```text
//! quantity ::= sign? number suffix
//! number   ::= digits | digits "." digits? | "." digits
//! suffix   ::= "" | "m" | "k" | "M" | "G" | "T" | "P" | "E"      (decimal SI)
//!            | "Ki" | "Mi" | "Gi" | "Ti" | "Pi" | "Ei"             (binary SI)
//!            | ("e" | "E") sign? digits                             (decimal exponent)
//! ```
//!
//! A lone `E` is the exa suffix; `E` followed by digits is an exponent. No whitespace is
//! allowed anywhere.
//!
//! Guarantees: the value is held exactly (a 128-bit mantissa, a power of ten and a power of
//! two); conversions round **up** like `Quantity.Value()` and `Quantity.MilliValue()` do, so
//! `"0.1m"` is 1 millicore and `"100m"` of memory is 1 byte. Values that do not fit an `i64`
//! after scaling, or mantissas over 38 digits, are [`QuantityError::OutOfRange`].

use std::fmt;
use std::str::FromStr;

/// A parsed quantity: `±mantissa × 10^exp10 × 2^pow2`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quantity {
    negative: bool,
    mantissa: u128,
    exp10: i32,
    pow2: u32,
}

/// Why a string is not a usable quantity. Each variant carries the input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    /// The string does not follow the quantity grammar.
    #[error("{quantity:?} is not a quantity: {reason}")]
    Malformed {
        /// The input.
        quantity: String,
        /// What part of the grammar failed.
        reason: &'static str,
    },
    /// The value does not fit the requested unit in 64 bits.
    #[error("{quantity:?} is out of range")]
    OutOfRange {
        /// The input.
        quantity: String,
    },
    /// A negative value where only non-negative amounts make sense (requests, limits).
    #[error("{quantity:?} is negative")]
    Negative {
        /// The input.
        quantity: String,
    },
}

/// Largest decimal exponent accepted; anything beyond overflows every unit anyway.
const MAX_EXPONENT: i32 = 1000;

impl Quantity {
    /// Parses `text` (see the module docs for the grammar).
    pub fn parse(text: &str) -> Result<Self, QuantityError> {
        let malformed = |reason| QuantityError::Malformed {
            quantity: text.to_owned(),
            reason,
        };
        let out_of_range = || QuantityError::OutOfRange {
            quantity: text.to_owned(),
        };
        let (negative, rest) = match text.as_bytes().first() {
            Some(b'-') => (true, &text[1..]),
            Some(b'+') => (false, &text[1..]),
            Some(_) => (false, text),
            None => return Err(malformed("empty")),
        };
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (number, suffix) = rest.split_at(number_len);
        let (int_part, frac_part) = number.split_once('.').unwrap_or((number, ""));
        if frac_part.contains('.') {
            return Err(malformed("more than one decimal point"));
        }
        if int_part.is_empty() && frac_part.is_empty() {
            return Err(malformed("no digits"));
        }
        let mut mantissa: u128 = 0;
        for digit in int_part.bytes().chain(frac_part.bytes()) {
            mantissa = mantissa
                .checked_mul(10)
                .and_then(|m| m.checked_add(u128::from(digit - b'0')))
                .ok_or_else(out_of_range)?;
        }
        let frac_digits = i32::try_from(frac_part.len()).map_err(|_| out_of_range())?;
        let (suffix_exp10, pow2) = parse_suffix(suffix).map_err(malformed)?;
        if suffix_exp10.abs() > MAX_EXPONENT {
            return Err(out_of_range());
        }
        Ok(Self {
            negative: negative && mantissa != 0,
            mantissa,
            exp10: suffix_exp10 - frac_digits,
            pow2,
        })
    }

    /// Whether the value is below zero.
    #[must_use]
    pub fn is_negative(&self) -> bool {
        self.negative
    }

    /// Whether the value is exactly zero.
    #[must_use]
    pub fn is_zero(&self) -> bool {
        self.mantissa == 0
    }

    /// `ceil(value × 10^scale)`, or `None` when it does not fit an `i128`.
    fn scaled_ceil(&self, scale: i32) -> Option<i128> {
        let magnitude = self.mantissa.checked_mul(1u128.checked_shl(self.pow2)?)?;
        let exponent = self.exp10.checked_add(scale)?;
        let (quotient, remainder) = if exponent >= 0 {
            let factor = 10u128.checked_pow(u32::try_from(exponent).ok()?)?;
            (magnitude.checked_mul(factor)?, 0)
        } else {
            match 10u128.checked_pow(exponent.unsigned_abs()) {
                Some(divisor) => (magnitude / divisor, magnitude % divisor),
                // 10^39 and beyond exceed any u128 magnitude: the quotient is 0.
                None => (0, magnitude),
            }
        };
        let quotient = i128::try_from(quotient).ok()?;
        Some(if self.negative {
            // Rounding toward +∞ truncates a negative value.
            -quotient
        } else {
            quotient + i128::from(remainder != 0)
        })
    }

    /// kubelet `Quantity.MilliValue()`: the value in thousandths, rounded up.
    pub fn milli_value(&self) -> Result<i64, QuantityError> {
        self.scaled_ceil(3)
            .and_then(|v| i64::try_from(v).ok())
            .ok_or_else(|| self.out_of_range())
    }

    /// kubelet `Quantity.Value()`: the value in units (bytes, pods), rounded up.
    pub fn value(&self) -> Result<i64, QuantityError> {
        self.scaled_ceil(0)
            .and_then(|v| i64::try_from(v).ok())
            .ok_or_else(|| self.out_of_range())
    }

    /// [`Self::milli_value`] for amounts that must not be negative (CPU requests and limits).
    pub fn milli_amount(&self) -> Result<u64, QuantityError> {
        self.non_negative(self.milli_value()?)
    }

    /// [`Self::value`] for amounts that must not be negative (memory requests and limits).
    pub fn amount(&self) -> Result<u64, QuantityError> {
        self.non_negative(self.value()?)
    }

    fn non_negative(&self, value: i64) -> Result<u64, QuantityError> {
        u64::try_from(value).map_err(|_| QuantityError::Negative {
            quantity: self.to_string(),
        })
    }

    fn out_of_range(&self) -> QuantityError {
        QuantityError::OutOfRange {
            quantity: self.to_string(),
        }
    }
}

/// `(decimal exponent, binary exponent)` of a suffix.
fn parse_suffix(suffix: &str) -> Result<(i32, u32), &'static str> {
    Ok(match suffix {
        "" => (0, 0),
        "m" => (-3, 0),
        "k" => (3, 0),
        "M" => (6, 0),
        "G" => (9, 0),
        "T" => (12, 0),
        "P" => (15, 0),
        "E" => (18, 0),
        "Ki" => (0, 10),
        "Mi" => (0, 20),
        "Gi" => (0, 30),
        "Ti" => (0, 40),
        "Pi" => (0, 50),
        "Ei" => (0, 60),
        _ => {
            let exponent = suffix.strip_prefix(['e', 'E']).ok_or("unknown suffix")?;
            let digits = exponent.strip_prefix(['+', '-']).unwrap_or(exponent);
            if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                return Err("exponent is not an integer");
            }
            // More digits than an i32 holds is out of range for every unit; clamp so the caller
            // reports it as such.
            (exponent.parse().unwrap_or(i32::MAX), 0)
        }
    })
}

impl FromStr for Quantity {
    type Err = QuantityError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl fmt::Display for Quantity {
    /// A plain, exact rendering (`±mantissa`, then `e<exp>` and `*2^<pow>` when not zero); not
    /// Kubernetes' canonical form.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.negative {
            f.write_str("-")?;
        }
        write!(f, "{}", self.mantissa)?;
        if self.exp10 != 0 {
            write!(f, "e{}", self.exp10)?;
        }
        if self.pow2 != 0 {
            write!(f, "*2^{}", self.pow2)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn milli(text: &str) -> i64 {
        Quantity::parse(text).unwrap().milli_value().unwrap()
    }

    fn value(text: &str) -> i64 {
        Quantity::parse(text).unwrap().value().unwrap()
    }

    #[test]
    fn cpu_quantities_convert_to_millicores() {
        assert_eq!(milli("100m"), 100);
        assert_eq!(milli("0.5"), 500);
        assert_eq!(milli("1"), 1000);
        assert_eq!(milli("1.5"), 1500);
        assert_eq!(milli("2k"), 2_000_000);
        assert_eq!(milli("1e3"), 1_000_000);
        assert_eq!(milli(".5"), 500);
        assert_eq!(milli("5."), 5000);
        assert_eq!(milli("+1"), 1000);
        assert_eq!(milli("0"), 0);
    }

    #[test]
    fn memory_quantities_convert_to_bytes() {
        assert_eq!(value("128Mi"), 134_217_728);
        assert_eq!(value("1G"), 1_000_000_000);
        assert_eq!(value("1Ki"), 1024);
        assert_eq!(value("1.5Gi"), 1_610_612_736);
        assert_eq!(value("1e3"), 1000);
        assert_eq!(value("12e+2"), 1200);
        assert_eq!(value("1E3"), 1000);
        assert_eq!(value("1E"), 1_000_000_000_000_000_000);
        assert_eq!(value("7Ei"), 7 << 60);
    }

    #[test]
    fn fractions_below_the_unit_round_up_like_kubernetes() {
        assert_eq!(milli("0.1m"), 1);
        assert_eq!(milli("0.0001"), 1);
        assert_eq!(milli("1e-3"), 1);
        assert_eq!(milli("1e-4"), 1);
        assert_eq!(value("100m"), 1);
        assert_eq!(value("0.5"), 1);
        assert_eq!(value("1e-100"), 1);
        assert_eq!(value("0e-100"), 0);
    }

    #[test]
    fn negative_quantities_parse_but_are_not_amounts() {
        let q = Quantity::parse("-1").unwrap();
        assert!(q.is_negative());
        assert_eq!(q.milli_value().unwrap(), -1000);
        assert_eq!(Quantity::parse("-0.5").unwrap().value().unwrap(), 0);
        assert!(matches!(q.amount(), Err(QuantityError::Negative { .. })));
        assert!(!Quantity::parse("-0").unwrap().is_negative());
    }

    #[test]
    fn malformed_quantities_are_rejected() {
        for text in [
            "", "m", "Mi", ".", "1.2.3", "1Ki2", " 1", "1 ", "abc", "1e", "1.e", "1mi", "1i",
            "--1", "1e1.5", "1e+", "0x10", "1KiB", "1,5",
        ] {
            assert!(
                matches!(Quantity::parse(text), Err(QuantityError::Malformed { .. })),
                "{text:?} should be malformed"
            );
        }
    }

    #[test]
    fn quantities_too_large_for_the_unit_are_out_of_range() {
        let huge = Quantity::parse("8Ei").unwrap();
        assert!(matches!(
            huge.value(),
            Err(QuantityError::OutOfRange { .. })
        ));
        let cpu = Quantity::parse("10P").unwrap();
        assert!(matches!(
            cpu.milli_value(),
            Err(QuantityError::OutOfRange { .. })
        ));
        assert!(matches!(
            Quantity::parse("1e5000"),
            Err(QuantityError::OutOfRange { .. })
        ));
        assert!(matches!(
            Quantity::parse("1234567890123456789012345678901234567890"),
            Err(QuantityError::OutOfRange { .. })
        ));
    }

    #[test]
    fn zero_is_zero_in_every_spelling() {
        for text in ["0", "0m", "0Gi", "0.000", "-0", "0e9"] {
            assert!(Quantity::parse(text).unwrap().is_zero(), "{text}");
        }
    }
}
