//! The subject of a client certificate that rustls already verified: kubelet's x509
//! authenticator maps its `CN` to the user name and each `O` to a group; and the validity
//! of a serving certificate (when to rotate it). A minimal DER walk (Certificate →
//! tbsCertificate → validity, subject), bounds-checked, never panicking.

use std::time::{Duration, SystemTime};

const OID_CN: &[u8] = &[0x55, 0x04, 0x03];
const OID_O: &[u8] = &[0x55, 0x04, 0x0a];

/// tbsCertificate from `issuer` on: the validity, then the rest.
fn after_issuer(der: &[u8]) -> Option<&[u8]> {
    let (cert, _) = tlv(der, 0x30)?;
    let (tbs, _) = tlv(cert, 0x30)?;
    let mut rest = tbs;
    // [0] version is optional.
    if rest.first() == Some(&0xa0) {
        rest = tlv(rest, 0xa0)?.1;
    }
    for tag in [0x02, 0x30, 0x30] {
        // serialNumber, signature, issuer
        rest = tlv(rest, tag)?.1;
    }
    Some(rest)
}

/// `notBefore` and `notAfter`; `None` if the DER is not a certificate.
pub fn validity(der: &[u8]) -> Option<(SystemTime, SystemTime)> {
    let (validity, _) = tlv(after_issuer(der)?, 0x30)?;
    let ((tag, text), rest) = any_tlv(validity)?;
    let not_before = time(tag, text)?;
    let ((tag, text), _) = any_tlv(rest)?;
    Some((not_before, time(tag, text)?))
}

/// A UTCTime (`YYMMDDHHMMSSZ`, 0x17) or GeneralizedTime (`YYYYMMDDHHMMSSZ`, 0x18).
fn time(tag: u8, text: &[u8]) -> Option<SystemTime> {
    let text = std::str::from_utf8(text).ok()?.strip_suffix('Z')?;
    let (year, rest) = match (tag, text.len()) {
        (0x17, 12) => {
            let yy: i64 = text.get(..2)?.parse().ok()?;
            (if yy < 50 { 2000 + yy } else { 1900 + yy }, &text[2..])
        }
        (0x18, 14) => (text.get(..4)?.parse().ok()?, &text[4..]),
        _ => return None,
    };
    let field = |i: usize| -> Option<i64> { rest.get(i..i + 2)?.parse().ok() };
    let (month, day) = (field(0)?, field(2)?);
    let (hour, minute, second) = (field(4)?, field(6)?, field(8)?);
    if !(1..=12).contains(&month)
        || !(1..=31).contains(&day)
        || hour > 23
        || minute > 59
        || second > 60
    {
        return None;
    }
    // Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's days_from_civil).
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = days * 86_400 + hour * 3600 + minute * 60 + second;
    let secs = u64::try_from(secs).ok()?;
    SystemTime::UNIX_EPOCH.checked_add(Duration::from_secs(secs))
}

/// `CN` and the `O`s of a certificate's subject; `None` if the DER is not a certificate.
pub fn subject(der: &[u8]) -> Option<(String, Vec<String>)> {
    // validity, then the subject.
    let rest = tlv(after_issuer(der)?, 0x30)?.1;
    let (mut rdns, _) = tlv(rest, 0x30)?;
    let (mut cn, mut orgs) = (None, Vec::new());
    while !rdns.is_empty() {
        let (mut set, next) = tlv(rdns, 0x31)?;
        rdns = next;
        while !set.is_empty() {
            let (attr, next) = tlv(set, 0x30)?;
            set = next;
            let (oid, value) = tlv(attr, 0x06)?;
            let (text, _) = any_tlv(value)?;
            let text = String::from_utf8_lossy(text.1).into_owned();
            match oid {
                OID_CN => cn = Some(text),
                OID_O => orgs.push(text),
                _ => {}
            }
        }
    }
    Some((cn?, orgs))
}

/// One TLV with the expected tag: (contents, the bytes after it).
fn tlv(input: &[u8], tag: u8) -> Option<(&[u8], &[u8])> {
    let ((found, contents), rest) = any_tlv(input)?;
    (found == tag).then_some((contents, rest))
}

type Tlv<'a> = ((u8, &'a [u8]), &'a [u8]);

fn any_tlv(input: &[u8]) -> Option<Tlv<'_>> {
    let (&tag, rest) = input.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        let count = usize::from(first & 0x7f);
        if count == 0 || count > 4 || rest.len() < count {
            return None;
        }
        let len = rest[..count]
            .iter()
            .fold(0usize, |acc, b| (acc << 8) | usize::from(*b));
        (len, &rest[count..])
    };
    if rest.len() < len {
        return None;
    }
    Some(((tag, &rest[..len]), &rest[len..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cert(cn: &str, orgs: &[&str]) -> Vec<u8> {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
        params.distinguished_name = rcgen::DistinguishedName::new();
        for o in orgs {
            params
                .distinguished_name
                .push(rcgen::DnType::OrganizationName, *o);
        }
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, cn);
        let key = rcgen::KeyPair::generate().expect("key");
        params.self_signed(&key).expect("cert").der().to_vec()
    }

    #[test]
    fn the_subject_gives_the_user_and_groups() {
        // (rcgen keeps one value per attribute type: one O here.)
        let der = cert("kube-apiserver-kubelet-client", &["kubeadm:cluster-admins"]);
        assert_eq!(
            subject(&der),
            Some((
                "kube-apiserver-kubelet-client".to_owned(),
                vec!["kubeadm:cluster-admins".to_owned()]
            ))
        );
    }

    #[test]
    fn the_validity_is_read_in_utc_and_generalized_time() {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
        // 2049 is a UTCTime, 2050 a GeneralizedTime (RFC 5280).
        params.not_before = rcgen::date_time_ymd(2024, 2, 29);
        params.not_after = rcgen::date_time_ymd(2050, 1, 2);
        let key = rcgen::KeyPair::generate().expect("key");
        let der = params.self_signed(&key).expect("cert").der().to_vec();
        let (from, to) = validity(&der).expect("validity");
        let secs = |t: SystemTime| {
            t.duration_since(SystemTime::UNIX_EPOCH)
                .expect("after")
                .as_secs()
        };
        assert_eq!(secs(from), 1_709_164_800);
        assert_eq!(secs(to), 2_524_694_400);
        params.not_after = rcgen::date_time_ymd(2049, 12, 31);
        let der = params.self_signed(&key).expect("cert").der().to_vec();
        assert_eq!(secs(validity(&der).expect("validity").1), 2_524_521_600);
    }

    #[test]
    fn truncated_or_garbage_der_is_none_never_a_panic() {
        let der = cert("user", &[]);
        for len in 0..der.len() {
            let _ = subject(&der[..len]);
            let _ = validity(&der[..len]);
        }
        assert_eq!(subject(&[0x30, 0x84, 0xff, 0xff, 0xff, 0xff]), None);
        assert_eq!(subject(b"garbage"), None);
    }
}
