//! The bookkeeping of a shared inotify instance, without any system call: which subscribers
//! listen on which watch descriptor, and where each event read from the instance goes.
//!
//! Generic over the watch descriptor type so that the unit tests can play the kernel's part,
//! wd reuse included, which a real kernel makes practically impossible to provoke (it
//! allocates wds cyclically up to `INT_MAX`).
//!
//! Rules (see the parent module for why):
//!
//! * One entry per wd; the kernel gives one wd per inode and instance, so every subscriber of
//!   an inode shares it. An entry remembers the inode (`(st_dev, st_ino)`) it was made for.
//! * A subscriber sees an event when the event's bits meet its own mask and, for an event
//!   about a directory entry, its name filter accepts the entry's name.
//! * `IN_IGNORED` (the kernel dropped the watch: the file or directory was deleted, its file
//!   system unmounted) ends the entry and tells its subscribers `removed`.
//! * A wd can only be reused once the kernel has freed it, and freeing it queues an
//!   `IN_IGNORED` for it. Until that `IN_IGNORED` is read, the wd is *stale*: every event read
//!   for it belongs to the old watch and is dropped, so it cannot reach the new one's
//!   subscribers. A wd becomes stale when we remove it ourselves (`inotify_rm_watch`
//!   succeeded) or when an add returns a wd we still hold for another inode.
//! * `IN_Q_OVERFLOW`: events were lost; every subscriber is told `overflowed`, and the stale
//!   counts are forgotten (the `IN_IGNORED`s they wait for may be among the lost).

use std::collections::HashMap;
use std::ffi::OsStr;
use std::hash::Hash;
use std::sync::Arc;

use nix::sys::inotify::AddWatchFlags;

use super::Subscriber;

/// The identity of the inode a watch was made for: `(st_dev, st_ino)`.
pub(super) type Inode = (u64, u64);

/// One event as read from the instance.
#[derive(Debug, Clone, Copy)]
pub(super) struct Event<'a, K> {
    pub wd: K,
    pub mask: AddWatchFlags,
    pub name: Option<&'a OsStr>,
}

/// A subscriber's interest in one wd.
struct Interest {
    subscriber: Arc<Subscriber>,
    mask: AddWatchFlags,
    /// How many times this subscriber added this inode (each add is removed once).
    refs: u32,
}

struct Entry {
    inode: Inode,
    interests: Vec<Interest>,
}

/// wd → subscribers, and the stale wds. See the module docs.
pub(super) struct Registry<K> {
    entries: HashMap<K, Entry>,
    /// `IN_IGNORED`s still to come for wds whose watch is gone.
    stale: HashMap<K, u32>,
}

impl<K> Default for Registry<K> {
    fn default() -> Self {
        Self {
            entries: HashMap::new(),
            stale: HashMap::new(),
        }
    }
}

/// The event bits a subscriber's mask can select (not the `IN_ONLYDIR`-like flags).
fn event_bits(mask: AddWatchFlags) -> AddWatchFlags {
    mask & AddWatchFlags::IN_ALL_EVENTS
}

impl<K: Copy + Eq + Hash> Registry<K> {
    /// No watch left: the instance's reader can stop.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// How many wds are held.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// `subscriber` added a watch on `inode` with `mask` and the kernel answered `wd`.
    pub fn add(&mut self, wd: K, inode: Inode, subscriber: &Arc<Subscriber>, mask: AddWatchFlags) {
        if self.entries.get(&wd).is_some_and(|e| e.inode != inode) {
            // The kernel freed the wd we hold (its IN_IGNORED is still queued) and gave it to
            // another inode: the old watch is over.
            if let Some(old) = self.entries.remove(&wd) {
                for interest in old.interests {
                    interest.subscriber.post(|c| c.removed = true);
                }
            }
            *self.stale.entry(wd).or_insert(0) += 1;
        }
        let entry = self.entries.entry(wd).or_insert_with(|| Entry {
            inode,
            interests: Vec::new(),
        });
        match entry
            .interests
            .iter_mut()
            .find(|i| Arc::ptr_eq(&i.subscriber, subscriber))
        {
            Some(interest) => {
                interest.mask |= mask;
                interest.refs += 1;
            }
            None => entry.interests.push(Interest {
                subscriber: subscriber.clone(),
                mask,
                refs: 1,
            }),
        }
    }

    /// `subscriber` drops one of its adds of `wd`. `true` if nobody listens on `wd` any more:
    /// the caller removes the kernel watch (and calls [`Registry::retired`] if that worked).
    /// A wd that already ended (or now belongs to another inode) is left alone.
    pub fn remove(&mut self, wd: K, subscriber: &Arc<Subscriber>) -> bool {
        let Some(entry) = self.entries.get_mut(&wd) else {
            return false;
        };
        let Some(at) = entry
            .interests
            .iter()
            .position(|i| Arc::ptr_eq(&i.subscriber, subscriber))
        else {
            return false;
        };
        entry.interests[at].refs -= 1;
        if entry.interests[at].refs == 0 {
            entry.interests.swap_remove(at);
        }
        if entry.interests.is_empty() {
            self.entries.remove(&wd);
            return true;
        }
        false
    }

    /// The caller removed `wd` from the kernel: its `IN_IGNORED` is on its way.
    pub fn retired(&mut self, wd: K) {
        *self.stale.entry(wd).or_insert(0) += 1;
    }

    /// Tells every subscriber that no more events will come.
    pub fn fail_all(&self, error: &Arc<std::io::Error>) {
        for entry in self.entries.values() {
            for interest in &entry.interests {
                interest.subscriber.fail(error);
            }
        }
    }

    /// Routes one event to its subscribers.
    pub fn dispatch(&mut self, event: Event<'_, K>) {
        if event.mask.contains(AddWatchFlags::IN_Q_OVERFLOW) {
            self.stale.clear();
            for entry in self.entries.values() {
                for interest in &entry.interests {
                    interest.subscriber.post(|c| c.overflowed = true);
                }
            }
            return;
        }
        let ignored = event.mask.contains(AddWatchFlags::IN_IGNORED);
        if let Some(count) = self.stale.get_mut(&event.wd) {
            // An event of the watch this wd used to be.
            if ignored {
                *count -= 1;
                if *count == 0 {
                    self.stale.remove(&event.wd);
                }
            }
            return;
        }
        if ignored {
            if let Some(entry) = self.entries.remove(&event.wd) {
                for interest in entry.interests {
                    interest.subscriber.post(|c| c.removed = true);
                }
            }
            return;
        }
        let Some(entry) = self.entries.get(&event.wd) else {
            return;
        };
        for interest in &entry.interests {
            let bits = event_bits(event.mask) & event_bits(interest.mask);
            if bits.is_empty() {
                continue;
            }
            if let Some(name) = event.name {
                if !interest.subscriber.accepts(name) {
                    continue;
                }
            }
            interest.subscriber.post(|c| c.events |= bits);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::Changes;
    use super::*;

    const MODIFY: AddWatchFlags = AddWatchFlags::IN_MODIFY;
    const DELETE_SELF: AddWatchFlags = AddWatchFlags::IN_DELETE_SELF;
    const IGNORED: AddWatchFlags = AddWatchFlags::IN_IGNORED;

    fn sub() -> Arc<Subscriber> {
        Arc::new(Subscriber::new(None))
    }

    fn ev(wd: i32, mask: AddWatchFlags) -> Event<'static, i32> {
        Event {
            wd,
            mask,
            name: None,
        }
    }

    fn taken(s: &Subscriber) -> Changes {
        s.take()
            .unwrap_or_else(|err| panic!("subscriber failed: {err}"))
    }

    #[test]
    fn subscribers_of_one_wd_each_see_only_their_own_mask() {
        let mut r = Registry::default();
        let (modify, delete) = (sub(), sub());
        r.add(1, (1, 10), &modify, MODIFY);
        r.add(1, (1, 10), &delete, DELETE_SELF | AddWatchFlags::IN_ONLYDIR);
        r.dispatch(ev(1, MODIFY));
        assert_eq!(taken(&modify).events, MODIFY);
        assert!(taken(&delete).is_empty());
        r.dispatch(ev(1, DELETE_SELF));
        assert!(taken(&modify).is_empty());
        assert_eq!(taken(&delete).events, DELETE_SELF);
    }

    #[test]
    fn a_wd_stays_until_its_last_subscriber_and_each_add_is_counted() {
        let mut r = Registry::default();
        let (a, b) = (sub(), sub());
        r.add(1, (1, 10), &a, MODIFY);
        r.add(1, (1, 10), &a, MODIFY);
        r.add(1, (1, 10), &b, MODIFY);
        assert!(!r.remove(1, &a), "a still holds a second add");
        assert!(!r.remove(1, &b));
        r.dispatch(ev(1, MODIFY));
        assert_eq!(taken(&a).events, MODIFY, "a's second add still listens");
        assert!(r.remove(1, &a), "the last subscriber removes the wd");
        assert!(r.is_empty());
        assert!(!r.remove(1, &a), "a wd that is gone is not removed twice");
    }

    #[test]
    fn in_ignored_tells_every_subscriber_of_the_wd_and_no_other() {
        let mut r = Registry::default();
        let (a, b, other) = (sub(), sub(), sub());
        r.add(1, (1, 10), &a, MODIFY);
        r.add(1, (1, 10), &b, DELETE_SELF);
        r.add(2, (1, 11), &other, MODIFY);
        r.dispatch(ev(1, DELETE_SELF));
        r.dispatch(ev(1, IGNORED));
        assert!(taken(&a).removed);
        let b_changes = taken(&b);
        assert!(b_changes.removed && b_changes.events == DELETE_SELF);
        assert!(taken(&other).is_empty());
        assert_eq!(r.len(), 1);
        // Their later removal does not touch the kernel again.
        assert!(!r.remove(1, &a) && !r.remove(1, &b));
    }

    #[test]
    fn a_wd_reused_after_our_own_removal_does_not_get_the_old_watchs_events() {
        let mut r = Registry::default();
        let (old, new) = (sub(), sub());
        r.add(7, (1, 10), &old, MODIFY);
        assert!(r.remove(7, &old));
        r.retired(7);
        // The kernel hands wd 7 to another inode before the old IN_IGNORED was read, with an
        // old IN_MODIFY still queued in front of it.
        r.add(7, (1, 20), &new, MODIFY);
        r.dispatch(ev(7, MODIFY));
        r.dispatch(ev(7, IGNORED));
        assert!(
            taken(&new).is_empty(),
            "the old watch's events went to the new one"
        );
        assert_eq!(r.len(), 1, "the old IN_IGNORED ended the new watch");
        r.dispatch(ev(7, MODIFY));
        assert_eq!(taken(&new).events, MODIFY);
        assert!(taken(&old).is_empty());
    }

    #[test]
    fn a_wd_reused_after_the_kernel_dropped_it_ends_the_old_subscribers_only() {
        let mut r = Registry::default();
        let (old, new) = (sub(), sub());
        r.add(3, (1, 10), &old, MODIFY);
        // The old directory was removed (IN_IGNORED queued, not read yet) and the kernel gave
        // wd 3 to another inode: the add tells the old subscriber at once.
        r.add(3, (1, 30), &new, MODIFY);
        assert!(taken(&old).removed);
        r.dispatch(ev(3, MODIFY));
        r.dispatch(ev(3, IGNORED));
        assert!(taken(&new).is_empty());
        r.dispatch(ev(3, MODIFY));
        assert_eq!(taken(&new).events, MODIFY);
        // The old subscriber's cleanup does not remove the new watch.
        assert!(!r.remove(3, &old));
        assert_eq!(r.len(), 1);
        assert!(r.remove(3, &new));
    }

    #[test]
    fn an_overflow_tells_everyone_and_forgets_stale_wds() {
        let mut r = Registry::default();
        let (a, b) = (sub(), sub());
        r.add(1, (1, 10), &a, MODIFY);
        r.add(2, (1, 11), &b, DELETE_SELF);
        r.retired(5);
        r.dispatch(ev(-1, AddWatchFlags::IN_Q_OVERFLOW));
        assert!(taken(&a).overflowed && taken(&b).overflowed);
        let c = sub();
        r.add(5, (1, 50), &c, MODIFY);
        r.dispatch(ev(5, MODIFY));
        assert_eq!(
            taken(&c).events,
            MODIFY,
            "a stale count outlived the overflow"
        );
    }

    #[test]
    fn a_name_filter_drops_events_about_other_entries() {
        let mut r = Registry::default();
        let only_a = Arc::new(Subscriber::new(Some(Box::new(|n: &OsStr| n == "a"))));
        let all = sub();
        r.add(1, (1, 10), &only_a, MODIFY);
        r.add(1, (1, 10), &all, MODIFY);
        let about = |name: &'static str| Event {
            wd: 1,
            mask: MODIFY,
            name: Some(OsStr::new(name)),
        };
        r.dispatch(about("b"));
        assert!(taken(&only_a).is_empty());
        assert_eq!(taken(&all).events, MODIFY);
        r.dispatch(about("a"));
        assert_eq!(taken(&only_a).events, MODIFY);
    }

    #[test]
    fn changes_accumulate_until_taken() {
        let mut r = Registry::default();
        let a = sub();
        r.add(1, (1, 10), &a, MODIFY | AddWatchFlags::IN_ATTRIB);
        for _ in 0..1000 {
            r.dispatch(ev(1, MODIFY));
        }
        r.dispatch(ev(1, AddWatchFlags::IN_ATTRIB));
        assert_eq!(taken(&a).events, MODIFY | AddWatchFlags::IN_ATTRIB);
        assert!(taken(&a).is_empty());
    }
}
