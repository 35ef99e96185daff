//! Resolving who the container runs as, the way containerd's CRI plugin does.
//!
//! The user string is `runAsUser[:runAsGroup]` when the security context sets one, else the
//! image's `USER`. It is one of:
//!
//! | form | uid | gid |
//! |---|---|---|
//! | `uid` | uid | the passwd entry's gid, or 0 when there is none |
//! | `name` | from passwd (unknown name: error) | from passwd |
//! | `uid:gid` | uid | gid |
//! | `name:gid`, `uid:group`, `name:group` | looked up (unknown: error) | looked up |
//!
//! `runAsGroup` without `runAsUser` is an error, as in containerd. Additional gids are the
//! primary gid (containerd's fix for CVE-2023-25173), the groups of `/etc/group` listing the
//! user by name (except a group named like the user), and the pod's supplemental groups; sorted
//! and without duplicates.
//!
//! `/etc/passwd` and `/etc/group` are read through [`Rootfs`], which never leaves the rootfs.

use crate::types::{ImageConfig, SecurityConfig};

use super::rootfs_file::Rootfs;
use super::SpecError;

/// The process identity of a container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ResolvedUser {
    pub uid: u32,
    pub gid: u32,
    pub additional_gids: Vec<u32>,
}

/// One entry of `/etc/passwd`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct PasswdEntry {
    name: String,
    uid: u32,
    gid: u32,
}

/// One entry of `/etc/group`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct GroupEntry {
    name: String,
    gid: u32,
    members: Vec<String>,
}

/// A user or group given by number or by name.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Id {
    Number(u32),
    Name(String),
}

impl Id {
    fn parse(field: &'static str, whole: &str, part: &str) -> Result<Id, SpecError> {
        let invalid = |reason| SpecError::InvalidUser {
            field,
            value: whole.to_owned(),
            reason,
        };
        if part.is_empty() {
            return Err(invalid("has an empty user or group"));
        }
        if part.bytes().all(|b| b.is_ascii_digit()) {
            return part
                .parse()
                .map(Id::Number)
                .map_err(|_| invalid("id does not fit in 32 bits"));
        }
        if part.contains(['\0', '/', '\n']) {
            return Err(invalid("contains a forbidden character"));
        }
        Ok(Id::Name(part.to_owned()))
    }
}

/// Resolves the container's uid, gid and additional gids against the rootfs.
pub(crate) fn resolve(
    rootfs: &Rootfs,
    security: &SecurityConfig,
    image: &ImageConfig,
) -> Result<ResolvedUser, SpecError> {
    let (field, user_string) = match (security.run_as_user, security.run_as_group) {
        (Some(uid), Some(gid)) => ("security.run_as_user", Some(format!("{uid}:{gid}"))),
        (Some(uid), None) => ("security.run_as_user", Some(uid.to_string())),
        (None, Some(gid)) => {
            return Err(SpecError::InvalidUser {
                field: "security.run_as_group",
                value: gid.to_string(),
                reason: "is set without run_as_user",
            })
        }
        (None, None) => ("image USER", image.user.clone().filter(|u| !u.is_empty())),
    };

    let files = Files::new(rootfs);
    let (uid, gid, user) = match &user_string {
        None => (0, 0, Id::Number(0)),
        Some(s) => {
            let mut parts = s.split(':');
            let user = Id::parse(field, s, parts.next().unwrap_or_default())?;
            let group = parts.next().map(|g| Id::parse(field, s, g)).transpose()?;
            if parts.next().is_some() {
                return Err(SpecError::InvalidUser {
                    field,
                    value: s.clone(),
                    reason: "has more than one ':'",
                });
            }
            let (uid, passwd_gid) = files.user(field, &user)?;
            let gid = match group {
                None => passwd_gid,
                Some(Id::Number(gid)) => gid,
                Some(Id::Name(name)) => files.group_by_name(field, &name)?,
            };
            (uid, gid, user)
        }
    };

    let username = match &user {
        Id::Name(name) => Some(name.clone()),
        Id::Number(uid) => files
            .passwd()?
            .into_iter()
            .find(|e| e.uid == *uid)
            .map(|e| e.name),
    };
    let mut additional_gids = vec![gid];
    if let Some(username) = username {
        for group in files.groups()? {
            if group.name != username && group.members.contains(&username) {
                additional_gids.push(group.gid);
            }
        }
    }
    additional_gids.extend(&security.supplemental_groups);
    additional_gids.sort_unstable();
    additional_gids.dedup();
    tracing::debug!(uid, gid, ?additional_gids, user = ?user_string, "resolved container user");
    Ok(ResolvedUser {
        uid,
        gid,
        additional_gids,
    })
}

/// Lazily read `/etc/passwd` and `/etc/group` of one rootfs.
struct Files<'a> {
    rootfs: &'a Rootfs,
}

impl<'a> Files<'a> {
    fn new(rootfs: &'a Rootfs) -> Self {
        Self { rootfs }
    }

    fn passwd(&self) -> Result<Vec<PasswdEntry>, SpecError> {
        Ok(self
            .rootfs
            .read("/etc/passwd")?
            .map(|content| parse_passwd(&content))
            .unwrap_or_default())
    }

    fn groups(&self) -> Result<Vec<GroupEntry>, SpecError> {
        Ok(self
            .rootfs
            .read("/etc/group")?
            .map(|content| parse_group(&content))
            .unwrap_or_default())
    }

    /// `(uid, gid)` of a user; a number without a passwd entry gets gid 0.
    fn user(&self, field: &'static str, user: &Id) -> Result<(u32, u32), SpecError> {
        let passwd = self.passwd()?;
        match user {
            Id::Number(uid) => Ok((
                *uid,
                passwd.iter().find(|e| e.uid == *uid).map_or(0, |e| e.gid),
            )),
            Id::Name(name) => passwd
                .iter()
                .find(|e| e.name == *name)
                .map(|e| (e.uid, e.gid))
                .ok_or_else(|| SpecError::UnknownUser {
                    field,
                    name: name.clone(),
                }),
        }
    }

    fn group_by_name(&self, field: &'static str, name: &str) -> Result<u32, SpecError> {
        self.groups()?
            .iter()
            .find(|g| g.name == name)
            .map(|g| g.gid)
            .ok_or_else(|| SpecError::UnknownGroup {
                field,
                name: name.to_owned(),
            })
    }
}

/// Entries of an `/etc/passwd`; malformed lines are skipped, as libc does.
fn parse_passwd(content: &str) -> Vec<PasswdEntry> {
    content
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(':').collect();
            Some(PasswdEntry {
                name: (*fields.first()?).to_owned(),
                uid: fields.get(2)?.parse().ok()?,
                gid: fields.get(3)?.parse().ok()?,
            })
        })
        .collect()
}

/// Entries of an `/etc/group`; malformed lines are skipped.
fn parse_group(content: &str) -> Vec<GroupEntry> {
    content
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(':').collect();
            Some(GroupEntry {
                name: (*fields.first()?).to_owned(),
                gid: fields.get(2)?.parse().ok()?,
                members: fields
                    .get(3)
                    .map(|m| {
                        m.split(',')
                            .map(str::trim)
                            .filter(|m| !m.is_empty())
                            .map(str::to_owned)
                            .collect()
                    })
                    .unwrap_or_default(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwd_lines_that_do_not_parse_are_skipped() {
        let entries = parse_passwd("root:x:0:0:root:/root:/bin/sh\n# comment\nbroken\nbad:x:a:1::/:\napp:x:1000:1000::/home/app:/bin/sh\n");
        assert_eq!(
            entries,
            vec![
                PasswdEntry {
                    name: "root".into(),
                    uid: 0,
                    gid: 0
                },
                PasswdEntry {
                    name: "app".into(),
                    uid: 1000,
                    gid: 1000
                },
            ]
        );
    }

    #[test]
    fn group_members_are_split_on_commas() {
        let groups = parse_group("wheel:x:10:root, app\nempty:x:11:\n");
        assert_eq!(groups[0].members, vec!["root".to_owned(), "app".to_owned()]);
        assert!(groups[1].members.is_empty());
    }

    #[test]
    fn a_numeric_id_too_large_for_32_bits_is_rejected() {
        assert!(matches!(
            Id::parse("image USER", "99999999999", "99999999999"),
            Err(SpecError::InvalidUser { .. })
        ));
    }
}
