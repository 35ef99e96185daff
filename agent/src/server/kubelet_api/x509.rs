//! The subject of a client certificate that rustls already verified: kubelet's x509
//! authenticator maps its `CN` to the user name and each `O` to a group. A minimal DER
//! walk (Certificate → tbsCertificate → subject), bounds-checked, never panicking.

const OID_CN: &[u8] = &[0x55, 0x04, 0x03];
const OID_O: &[u8] = &[0x55, 0x04, 0x0a];

/// `CN` and the `O`s of a certificate's subject; `None` if the DER is not a certificate.
pub fn subject(der: &[u8]) -> Option<(String, Vec<String>)> {
    let (cert, _) = tlv(der, 0x30)?;
    let (tbs, _) = tlv(cert, 0x30)?;
    let mut rest = tbs;
    // [0] version is optional.
    if rest.first() == Some(&0xa0) {
        rest = tlv(rest, 0xa0)?.1;
    }
    for tag in [0x02, 0x30, 0x30, 0x30] {
        // serialNumber, signature, issuer, validity
        rest = tlv(rest, tag)?.1;
    }
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
    fn truncated_or_garbage_der_is_none_never_a_panic() {
        let der = cert("user", &[]);
        for len in 0..der.len() {
            let _ = subject(&der[..len]);
        }
        assert_eq!(subject(&[0x30, 0x84, 0xff, 0xff, 0xff, 0xff]), None);
        assert_eq!(subject(b"garbage"), None);
    }
}
