//! Registry credentials and configuration, the files a pull reads from outside the process:
//! a docker `config.json` (a pod's `kubernetes.io/dockerconfigjson` secret, the node's file),
//! a legacy `.dockercfg`, k3s-style `registries.yaml` (mirrors, rewrites, auth, TLS) and a
//! `--platform` string. The first input byte picks the parser; found entries are looked up
//! and resolved as a pull does.
#![no_main]

use std::path::Path;

use ironlet_runtime::image::{Keyring, PlatformSpec, Reference, RegistriesConfig};
use libfuzzer_sys::fuzz_target;

const HOSTS: [&str; 4] = ["docker.io", "127.0.0.1:5000", "a.b.example.com", ""];

fn exercise(ring: &Keyring) {
    for host in HOSTS {
        let _ = ring.lookup(host);
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&which, body)) = data.split_first() else {
        return;
    };
    match which % 4 {
        0 => {
            if let Ok(ring) = Keyring::from_config_json(body, "fuzz") {
                exercise(&ring);
            }
        }
        1 => {
            if let Ok(ring) = Keyring::from_dockercfg(body, "fuzz") {
                exercise(&ring);
            }
        }
        2 => {
            let Ok(text) = std::str::from_utf8(body) else {
                return;
            };
            let Ok(cfg) = RegistriesConfig::parse(text, Path::new("registries.yaml")) else {
                return;
            };
            if let Ok(ring) = cfg.keyring() {
                exercise(&ring);
            }
            for r in ["busybox:1", "127.0.0.1:5000/a/b:2", "docker.io/library/x@sha256:0000000000000000000000000000000000000000000000000000000000000000"] {
                if let Ok(reference) = Reference::parse(r) {
                    let _ = cfg.endpoints(&reference);
                }
            }
        }
        _ => {
            if let Ok(text) = std::str::from_utf8(body) {
                let _ = PlatformSpec::parse(text);
            }
        }
    }
});
