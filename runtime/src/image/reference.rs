//! [`Reference`]: image names parsed and normalised exactly as Docker does
//! (`github.com/distribution/reference`, `ParseNormalizedNamed` + `TagNameOnly`).
//!
//! ```text
//!  busybox                          -> docker.io/library/busybox:latest
//!  foo/bar:1                        -> docker.io/foo/bar:1
//!  index.docker.io/busybox          -> docker.io/library/busybox:latest
//!  localhost:5000/x                 -> localhost:5000/x:latest
//!  registry.example.com/x@sha256:…  -> registry.example.com/x@sha256:…   (no tag added)
//! ```
//!
//! Guarantees: a `Reference` always satisfies the grammar (lowercase path components, a
//! domain only when the first component has a `.`/`:`, is `localhost` or has uppercase, tag
//! `[\w][\w.-]{0,127}`, name ≤ 255 characters, digests only `sha256:<64 hex>`); its
//! [`Display`](std::fmt::Display) form is the canonical string the index is keyed by.
//! Anything else is [`ImageError::InvalidReference`] (kubelet `InvalidImageName`).

use std::fmt;
use std::str::FromStr;

use super::digest::Digest;
use super::error::ImageError;

const DEFAULT_DOMAIN: &str = "docker.io";
const LEGACY_DEFAULT_DOMAIN: &str = "index.docker.io";
const OFFICIAL_REPO_PREFIX: &str = "library/";
const DEFAULT_TAG: &str = "latest";
const NAME_TOTAL_LENGTH_MAX: usize = 255;

/// A normalised image reference: `domain/path[:tag][@digest]`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Reference {
    domain: String,
    path: String,
    tag: Option<String>,
    digest: Option<String>,
}

impl Reference {
    /// Parses and normalises; adds `:latest` when there is neither tag nor digest.
    pub fn parse(s: &str) -> Result<Self, ImageError> {
        let bad = |reason: &'static str| ImageError::InvalidReference {
            reference: s.to_owned(),
            reason,
        };
        if s.is_empty() {
            return Err(bad("empty reference"));
        }
        let (rest, digest) = match s.split_once('@') {
            Some((r, d)) => {
                if Digest::parse(d).is_none() {
                    return Err(bad("digest must be sha256:<64 lowercase hex>"));
                }
                (r, Some(d.to_owned()))
            }
            None => (s, None),
        };
        let last_slash = rest.rfind('/').map_or(0, |i| i + 1);
        let (name, tag) = match rest[last_slash..].rfind(':') {
            Some(i) => (&rest[..last_slash + i], Some(&rest[last_slash + i + 1..])),
            None => (rest, None),
        };
        if let Some(t) = tag {
            if !valid_tag(t) {
                return Err(bad("invalid tag"));
            }
        }
        let (domain, path) = split_domain(name);
        if let Some(d) = domain {
            if !valid_domain(d) {
                return Err(bad("invalid registry domain"));
            }
        } else if name.len() == 64 && name.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(bad(
                "cannot use a 64-character hexadecimal string as a repository",
            ));
        }
        if path.bytes().any(|b| b.is_ascii_uppercase()) {
            return Err(bad("repository name must be lowercase"));
        }
        if path.is_empty() || !path.split('/').all(valid_path_component) {
            return Err(bad("invalid repository name"));
        }
        let domain = match domain {
            None | Some(LEGACY_DEFAULT_DOMAIN) => DEFAULT_DOMAIN.to_owned(),
            Some(d) => d.to_owned(),
        };
        let path = if domain == DEFAULT_DOMAIN && !path.contains('/') {
            format!("{OFFICIAL_REPO_PREFIX}{path}")
        } else {
            path.to_owned()
        };
        // Docker measures the normalised name (`docker.io/library/x`), so that every
        // accepted reference's canonical form parses again.
        if domain.len() + 1 + path.len() > NAME_TOTAL_LENGTH_MAX {
            return Err(bad("repository name longer than 255 characters"));
        }
        let tag = match (tag, &digest) {
            (Some(t), _) => Some(t.to_owned()),
            (None, None) => Some(DEFAULT_TAG.to_owned()),
            (None, Some(_)) => None,
        };
        Ok(Self {
            domain,
            path,
            tag,
            digest,
        })
    }

    /// The registry host (and port), e.g. `docker.io`.
    pub fn domain(&self) -> &str {
        &self.domain
    }

    /// The repository path within the registry, e.g. `library/busybox`.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// `domain/path`, e.g. `docker.io/library/busybox`.
    pub fn name(&self) -> String {
        format!("{}/{}", self.domain, self.path)
    }

    pub fn tag(&self) -> Option<&str> {
        self.tag.as_deref()
    }

    pub fn digest(&self) -> Option<&str> {
        self.digest.as_deref()
    }

    /// The same repository with another tag and no digest.
    pub fn with_tag(&self, tag: &str) -> Result<Self, ImageError> {
        Self::parse(&format!("{}:{tag}", self.name()))
    }

    /// `name@digest` for a manifest digest.
    pub(crate) fn repo_digest(&self, manifest: &Digest) -> String {
        format!("{}@{manifest}", self.name())
    }
}

impl fmt::Display for Reference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.domain, self.path)?;
        if let Some(t) = &self.tag {
            write!(f, ":{t}")?;
        }
        if let Some(d) = &self.digest {
            write!(f, "@{d}")?;
        }
        Ok(())
    }
}

impl FromStr for Reference {
    type Err = ImageError;
    fn from_str(s: &str) -> Result<Self, ImageError> {
        Self::parse(s)
    }
}

/// Docker's `splitDockerDomain`: the first component is a domain if it contains `.` or `:`,
/// is `localhost`, or is not all lowercase.
fn split_domain(name: &str) -> (Option<&str>, &str) {
    match name.split_once('/') {
        Some((first, rest))
            if first.contains(['.', ':'])
                || first == "localhost"
                || first.bytes().any(|b| b.is_ascii_uppercase()) =>
        {
            (Some(first), rest)
        }
        _ => (None, name),
    }
}

/// `[a-z0-9]+(?:(?:[._]|__|[-]+)[a-z0-9]+)*`
fn valid_path_component(c: &str) -> bool {
    let b = c.as_bytes();
    let alnum = |x: u8| x.is_ascii_lowercase() || x.is_ascii_digit();
    if b.is_empty() || !alnum(b[0]) || !alnum(b[b.len() - 1]) {
        return false;
    }
    let mut i = 0;
    while i < b.len() {
        if alnum(b[i]) {
            i += 1;
            continue;
        }
        let start = i;
        while i < b.len() && !alnum(b[i]) {
            i += 1;
        }
        let sep = &c[start..i];
        let ok = sep == "." || sep == "_" || sep == "__" || sep.bytes().all(|x| x == b'-');
        if !ok {
            return false;
        }
    }
    true
}

/// Host labels `[a-zA-Z0-9]([a-zA-Z0-9-]*[a-zA-Z0-9])?` joined by `.`, or `[ipv6]`, then an
/// optional `:port`.
fn valid_domain(d: &str) -> bool {
    let (host, port) = if let Some(rest) = d.strip_prefix('[') {
        match rest.split_once(']') {
            Some((ip, after)) => {
                if ip.is_empty() || !ip.bytes().all(|b| b.is_ascii_hexdigit() || b == b':') {
                    return false;
                }
                match after {
                    "" => return true,
                    p => (None, p.strip_prefix(':').map(Some).unwrap_or(Some(""))),
                }
            }
            None => return false,
        }
    } else {
        match d.split_once(':') {
            Some((h, p)) => (Some(h), Some(p)),
            None => (Some(d), None),
        }
    };
    if let Some(p) = port {
        if p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) {
            return false;
        }
    }
    match host {
        None => true,
        Some(h) => {
            !h.is_empty()
                && h.split('.').all(|label| {
                    let b = label.as_bytes();
                    !b.is_empty()
                        && b[0].is_ascii_alphanumeric()
                        && b[b.len() - 1].is_ascii_alphanumeric()
                        && b.iter().all(|x| x.is_ascii_alphanumeric() || *x == b'-')
                })
        }
    }
}

/// `[\w][\w.-]{0,127}`
fn valid_tag(t: &str) -> bool {
    let b = t.as_bytes();
    let word = |x: u8| x.is_ascii_alphanumeric() || x == b'_';
    !b.is_empty()
        && b.len() <= 128
        && word(b[0])
        && b.iter().all(|x| word(*x) || *x == b'.' || *x == b'-')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn norm(s: &str) -> String {
        Reference::parse(s).unwrap().to_string()
    }

    #[test]
    fn short_names_get_docker_io_library_and_latest() {
        assert_eq!(norm("busybox"), "docker.io/library/busybox:latest");
        assert_eq!(norm("busybox:latest"), "docker.io/library/busybox:latest");
        assert_eq!(
            norm("docker.io/library/busybox:latest"),
            "docker.io/library/busybox:latest"
        );
        assert_eq!(
            norm("index.docker.io/busybox"),
            "docker.io/library/busybox:latest"
        );
        assert_eq!(norm("docker.io/busybox:1"), "docker.io/library/busybox:1");
    }

    #[test]
    fn user_repositories_get_docker_io_only() {
        assert_eq!(norm("foo/bar:1"), "docker.io/foo/bar:1");
        assert_eq!(norm("foo/bar/baz"), "docker.io/foo/bar/baz:latest");
    }

    #[test]
    fn registries_with_ports_and_digests_are_kept() {
        assert_eq!(norm("localhost:5000/x"), "localhost:5000/x:latest");
        assert_eq!(norm("localhost/x:2"), "localhost/x:2");
        let d = format!("sha256:{}", "ab".repeat(32));
        assert_eq!(
            norm(&format!("registry.example.com/x@{d}")),
            format!("registry.example.com/x@{d}")
        );
        assert_eq!(
            norm(&format!("busybox:1.36@{d}")),
            format!("docker.io/library/busybox:1.36@{d}")
        );
        let r = Reference::parse(&format!("registry.example.com/x@{d}")).unwrap();
        assert_eq!(r.tag(), None);
        assert_eq!(r.digest(), Some(d.as_str()));
        assert_eq!(r.name(), "registry.example.com/x");
    }

    #[test]
    fn invalid_names_are_rejected_as_invalid_image_name() {
        for bad in [
            "",
            "Busybox",
            "busybox:",
            "busybox:-x",
            ":tag",
            "a//b",
            "-a",
            "a-",
            "a..b",
            "a___b",
            "busybox@sha256:abc",
            "busybox@md5:0123",
            "registry.example.com:port/x",
            "registry..com/x",
            "x/",
            &"a".repeat(64),
            &format!("{}:1", "b".repeat(256)),
            &format!("busybox:{}", "t".repeat(129)),
        ] {
            let e = Reference::parse(bad).expect_err(bad);
            assert_eq!(e.kubelet_reason(), "InvalidImageName", "{bad}");
        }
    }

    #[test]
    fn separators_follow_the_distribution_grammar() {
        for good in ["a.b", "a_b", "a__b", "a---b", "a-b.c_d", "0"] {
            assert!(Reference::parse(good).is_ok(), "{good}");
        }
        assert!(Reference::parse("UPPER.example.com/x").is_ok());
        assert!(Reference::parse("[::1]:5000/x").is_ok());
    }

    /// Found by `scripts/fuzz` (target `reference`): a short name under 255 characters whose
    /// normalised form (`docker.io/library/…`) is longer was accepted, and the canonical
    /// string the store keeps then failed to parse.
    #[test]
    fn the_length_limit_applies_to_the_normalised_name_so_canonical_forms_reparse() {
        let found =
            include_str!("../../../fuzz/regressions/reference/short-name-too-long-once-normalised");
        for input in [
            found.to_owned(),
            "a".repeat(238),
            format!("foo/{}", "b".repeat(242)),
        ] {
            if let Ok(r) = Reference::parse(&input) {
                let shown = r.to_string();
                assert!(Reference::parse(&shown).is_ok(), "{shown} does not reparse");
            }
        }
        assert!(Reference::parse(&"a".repeat(238)).is_err());
        assert!(Reference::parse(&"a".repeat(237)).is_ok());
        assert!(Reference::parse(&format!("example.com/{}", "c".repeat(243))).is_ok());
        assert!(Reference::parse(&format!("example.com/{}", "c".repeat(244))).is_err());
    }
}
