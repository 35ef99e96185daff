//! [`PlatformSpec`]: which manifest of an image index a pull takes (`os/arch[/variant]`,
//! the node's own by default), with containerd's matching rules for variants: a wanted
//! variant must equal the candidate's, where `arm64` without a variant is `v8`.

use std::fmt;

use crate::image::error::ImageError;
use crate::image::oci::{self, Descriptor, Platform};

/// A wanted platform.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlatformSpec {
    pub os: String,
    pub architecture: String,
    pub variant: Option<String>,
}

impl PlatformSpec {
    /// This node's platform (`linux/amd64`, `linux/arm64/v8`…).
    pub fn host() -> Self {
        let (os, arch) = oci::host_platform();
        Self {
            os: os.to_owned(),
            architecture: arch.to_owned(),
            variant: (arch == "arm64").then(|| "v8".to_owned()),
        }
    }

    /// Parses `os/arch[/variant]` (what `--platform` takes).
    pub fn parse(s: &str) -> Result<Self, ImageError> {
        let bad = || ImageError::InvalidReference {
            reference: s.to_owned(),
            reason: "a platform is os/arch[/variant], e.g. linux/arm64/v8",
        };
        let mut parts = s.split('/');
        let (Some(os), Some(arch)) = (parts.next(), parts.next()) else {
            return Err(bad());
        };
        let variant = parts.next().map(str::to_owned);
        if os.is_empty() || arch.is_empty() || parts.next().is_some() {
            return Err(bad());
        }
        Ok(Self {
            os: os.to_owned(),
            architecture: arch.to_owned(),
            variant,
        })
    }

    fn matches(&self, p: &Platform) -> bool {
        let normal = |arch: &str, v: Option<&str>| match (arch, v) {
            ("arm64", None) => Some("v8".to_owned()),
            (_, v) => v.map(str::to_owned),
        };
        p.os == self.os
            && p.architecture == self.architecture
            && match normal(&self.architecture, self.variant.as_deref()) {
                None => true,
                Some(want) => normal(&p.architecture, p.variant.as_deref()) == Some(want),
            }
    }

    /// The manifest of an index for this platform.
    pub(crate) fn select<'a>(&self, manifests: &'a [Descriptor]) -> Option<&'a Descriptor> {
        manifests
            .iter()
            .find(|d| d.platform.as_ref().is_some_and(|p| self.matches(p)))
    }
}

impl fmt::Display for PlatformSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.os, self.architecture)?;
        if let Some(v) = &self.variant {
            write!(f, "/{v}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::image::digest::Digest;

    fn desc(arch: &str, variant: Option<&str>, n: u8) -> Descriptor {
        Descriptor {
            media_type: oci::MT_OCI_MANIFEST.into(),
            digest: Digest::of_bytes(&[n]),
            size: 1,
            annotations: Default::default(),
            platform: Some(Platform {
                architecture: arch.into(),
                os: "linux".into(),
                variant: variant.map(Into::into),
            }),
        }
    }

    #[test]
    fn arm_variants_are_told_apart_and_arm64_defaults_to_v8() {
        let list = [
            desc("amd64", None, 0),
            desc("arm", Some("v6"), 1),
            desc("arm", Some("v7"), 2),
            desc("arm64", None, 3),
        ];
        let pick = |s: &str| {
            PlatformSpec::parse(s)
                .unwrap()
                .select(&list)
                .map(|d| d.digest.clone())
        };
        assert_eq!(pick("linux/arm/v7"), Some(list[2].digest.clone()));
        assert_eq!(pick("linux/arm/v6"), Some(list[1].digest.clone()));
        assert_eq!(pick("linux/arm64/v8"), Some(list[3].digest.clone()));
        assert_eq!(pick("linux/amd64"), Some(list[0].digest.clone()));
        assert_eq!(pick("linux/s390x"), None);
        assert_eq!(pick("windows/amd64"), None);
    }

    #[test]
    fn a_platform_needs_os_and_architecture() {
        assert!(PlatformSpec::parse("linux").is_err());
        assert!(PlatformSpec::parse("linux/").is_err());
        assert!(PlatformSpec::parse("linux/arm/v7/x").is_err());
        assert_eq!(
            PlatformSpec::parse("linux/arm/v7").unwrap().to_string(),
            "linux/arm/v7"
        );
    }
}
