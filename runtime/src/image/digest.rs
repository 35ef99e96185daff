//! [`Digest`]: a validated `sha256:<64 lowercase hex>` content address, and readers/writers
//! that compute one while data streams through.
//!
//! Guarantees: a `Digest` value (constructed, parsed or deserialised) always has exactly that
//! shape, so its hex part is safe to use as a file name. Other algorithms are refused.

use std::fmt;
use std::io::{self, Read};

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

/// A `sha256:<hex>` digest.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub(crate) struct Digest(String);

impl Digest {
    pub(crate) const PREFIX: &'static str = "sha256:";

    /// Parses `sha256:<64 lowercase hex>`.
    pub(crate) fn parse(s: &str) -> Option<Self> {
        let hex = s.strip_prefix(Self::PREFIX)?;
        is_sha256_hex(hex).then(|| Self(s.to_owned()))
    }

    /// From the 64 hex characters alone.
    pub(crate) fn from_hex(hex: &str) -> Option<Self> {
        is_sha256_hex(hex).then(|| Self(format!("{}{hex}", Self::PREFIX)))
    }

    pub(crate) fn of_bytes(bytes: &[u8]) -> Self {
        Self(format!(
            "{}{}",
            Self::PREFIX,
            hex::encode(Sha256::digest(bytes))
        ))
    }

    pub(crate) fn hex(&self) -> &str {
        &self.0[Self::PREFIX.len()..]
    }
}

/// `true` for exactly 64 lowercase hex characters.
pub(crate) fn is_sha256_hex(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl TryFrom<String> for Digest {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        Self::parse(&s).ok_or_else(|| format!("unsupported or malformed digest {s:?}"))
    }
}

impl From<Digest> for String {
    fn from(d: Digest) -> Self {
        d.0
    }
}

/// A running sha256 with a byte count.
#[derive(Default)]
pub(crate) struct Hasher {
    sha: Sha256,
    len: u64,
}

impl Hasher {
    pub(crate) fn update(&mut self, bytes: &[u8]) {
        self.sha.update(bytes);
        self.len += bytes.len() as u64;
    }

    /// The digest and number of bytes seen.
    pub(crate) fn finish(self) -> (Digest, u64) {
        (
            Digest(format!(
                "{}{}",
                Digest::PREFIX,
                hex::encode(self.sha.finalize())
            )),
            self.len,
        )
    }
}

/// Hashes everything read through it.
pub(crate) struct HashingReader<R> {
    inner: R,
    hasher: Hasher,
}

impl<R: Read> HashingReader<R> {
    pub(crate) fn new(inner: R) -> Self {
        Self {
            inner,
            hasher: Hasher::default(),
        }
    }

    /// Reads the rest of the stream (e.g. tar padding after the end-of-archive marker), at
    /// most `limit` bytes of it, and returns the digest and size of everything; `None` when
    /// more than `limit` bytes were left (the rest is not read).
    pub(crate) fn drain_within(mut self, limit: u64) -> io::Result<Option<(Digest, u64)>> {
        let left = io::copy(
            &mut (&mut self).take(limit.saturating_add(1)),
            &mut io::sink(),
        )?;
        Ok((left <= limit).then(|| self.hasher.finish()))
    }
}

impl<R: Read> Read for HashingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digest_parse_accepts_only_sha256_with_64_lowercase_hex() {
        let hex = "a".repeat(64);
        assert!(Digest::parse(&format!("sha256:{hex}")).is_some());
        assert!(Digest::parse(&format!("sha256:{}", "A".repeat(64))).is_none());
        assert!(Digest::parse(&format!("sha512:{hex}")).is_none());
        assert!(Digest::parse("sha256:abc").is_none());
        assert!(Digest::parse(&format!("sha256:{}/..", "a".repeat(61))).is_none());
    }

    #[test]
    fn hashing_reader_counts_bytes_drained_after_the_consumer_stops() {
        let data = vec![7u8; 10_000];
        let mut r = HashingReader::new(&data[..]);
        let mut first = [0u8; 100];
        r.read_exact(&mut first).unwrap();
        let (d, n) = r.drain_within(9_900).unwrap().unwrap();
        assert_eq!(n, 10_000);
        assert_eq!(d, Digest::of_bytes(&data));
        let mut r = HashingReader::new(&data[..]);
        r.read_exact(&mut first).unwrap();
        assert_eq!(r.drain_within(9_899).unwrap(), None);
    }
}
