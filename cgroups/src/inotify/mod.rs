//! One inotify instance per tokio runtime, shared by every watch of the process: the pods'
//! cgroup watchers (`memory.events`, `cgroup.events`), the agent's static pod path and its
//! `kubectl logs -f` followers.
//!
//! Linux counts inotify instances per user (`fs.inotify.max_user_instances`, 128 by default,
//! shared with every other process of that user: containerd, systemd, a kubelet). An instance
//! per watcher ran out at about 60 pods on cgroup v2 (two watchers each). Watches are counted
//! separately (`fs.inotify.max_user_watches`, thousands), and one instance holds any number of
//! them, so this module multiplexes:
//!
//! ```text
//!   Watch::add(path, mask) ── inotify_add_watch(IN_MASK_ADD) ──► wd ─┐
//!                                                                    ▼
//!   Watch::changed() ◄── Notify ── Subscriber ◄── Registry: wd → [(subscriber, mask, refs)]
//!     (takes the pending Changes)   (pending        ▲
//!                                    Changes)       │ dispatch, under the instance's lock
//!                                     reader task: AsyncFd readable → read_events
//! ```
//!
//! Guarantees:
//!
//! * **Level-triggered, nothing lost**: a subscriber's changes accumulate (event bits OR-ed,
//!   `removed`, `overflowed`) until it takes them; a subscriber that is slow or not waiting
//!   loses no "something changed", but several events collapse into one wake-up. Callers
//!   re-read the state they watch after each wake-up.
//! * **Masks**: the kernel has one wd per inode and instance; its mask is the union of its
//!   subscribers' masks (`IN_MASK_ADD`), and each subscriber only sees the bits of its own
//!   mask (and, for events about directory entries, the names its filter accepts).
//! * **Lifetime**: a wd lives as long as one of its subscribers (adds are counted), then is
//!   removed from the kernel; the reader task stops when the instance holds no watch, and the
//!   instance closes when no [`Watch`] uses it.
//! * **Removal**: when the kernel drops a watch (`IN_IGNORED`: the file or directory was
//!   deleted, its file system unmounted), its subscribers get `removed`.
//! * **wd reuse** cannot route an old watch's events to a new watch: see `registry`.
//! * **Overflow** of the shared queue (`fs.inotify.max_queued_events`, 16384 events): every
//!   subscriber gets `overflowed` and must re-check.
//!
//! Current behaviour, not contract: the instance is per runtime (`Handle::id`) because its
//! reader task runs on one; a [`Watch`] is served by the reader of the runtime it was made on.

mod registry;

use std::ffi::OsStr;
use std::io;
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};

use nix::errno::Errno;
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, WatchDescriptor};
use tokio::io::unix::AsyncFd;
use tokio::runtime::Handle;
use tokio::sync::Notify;

use self::registry::{Event, Registry};
use crate::watch::{register_readable, OwnsFd};

/// What went wrong with a shared inotify instance or one of its watches.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// `inotify_init1` failed (e.g. the per-user instance limit).
    #[error("creating an inotify instance")]
    Init(#[source] Errno),
    /// Opening or watching the path failed (it does not exist, is not a directory though
    /// `IN_ONLYDIR` was asked, or the per-user watch limit was reached).
    #[error("watching {path}")]
    AddWatch {
        /// The path.
        path: PathBuf,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// Watches need a tokio runtime (with I/O enabled) for the reader task.
    #[error("inotify watches need a tokio runtime")]
    NoRuntime,
    /// Starting the reader task (duplicating the descriptor, registering it with tokio)
    /// failed.
    #[error("starting the inotify reader")]
    Reader(#[source] io::Error),
    /// Reading events failed: the reader stopped, no further change will be reported.
    #[error("reading inotify events")]
    Read(#[source] Arc<io::Error>),
}

/// What happened to a subscriber's watches since it last took its changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Changes {
    /// The union of the event bits seen (within the subscriber's masks).
    pub events: AddWatchFlags,
    /// The kernel dropped one of the subscriber's watches (`IN_IGNORED`): its path was
    /// deleted or unmounted. That watch reports nothing more.
    pub removed: bool,
    /// The instance's event queue overflowed: events may have been lost, re-check.
    pub overflowed: bool,
}

impl Default for Changes {
    fn default() -> Self {
        Self {
            events: AddWatchFlags::empty(),
            removed: false,
            overflowed: false,
        }
    }
}

impl Changes {
    /// Nothing happened.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.events.is_empty() && !self.removed && !self.overflowed
    }
}

/// Decides, by name, whether an event about an entry of a watched directory concerns the
/// subscriber. Runs on the reader task under the instance's lock: keep it cheap.
pub type NameFilter = Box<dyn Fn(&OsStr) -> bool + Send + Sync>;

/// A subscriber's mailbox: pending changes and the wake-up of its waiter.
pub(crate) struct Subscriber {
    pending: Mutex<Pending>,
    notify: Notify,
    filter: Option<NameFilter>,
}

#[derive(Default)]
struct Pending {
    changes: Changes,
    failed: Option<Arc<io::Error>>,
}

impl Subscriber {
    fn new(filter: Option<NameFilter>) -> Self {
        Self {
            pending: Mutex::default(),
            notify: Notify::new(),
            filter,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Pending> {
        self.pending.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records a change and wakes the waiter (or leaves it a permit if none waits).
    fn post(&self, change: impl FnOnce(&mut Changes)) {
        change(&mut self.lock().changes);
        self.notify.notify_one();
    }

    fn fail(&self, error: &Arc<io::Error>) {
        self.lock().failed = Some(error.clone());
        self.notify.notify_one();
    }

    fn accepts(&self, name: &OsStr) -> bool {
        self.filter.as_ref().is_none_or(|accept| accept(name))
    }

    fn take(&self) -> Result<Changes, Error> {
        let mut pending = self.lock();
        if let Some(error) = &pending.failed {
            return Err(Error::Read(error.clone()));
        }
        Ok(std::mem::take(&mut pending.changes))
    }
}

struct Shared {
    inotify: Inotify,
    state: Mutex<State>,
    /// Wakes the reader when the last watch went, so that it stops.
    idle: Notify,
}

#[derive(Default)]
struct State {
    registry: Registry<WatchDescriptor>,
    /// The generation of the running reader task, if one runs.
    reader: Option<u64>,
    generations: u64,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A handle on a shared inotify instance. Cheap to clone.
#[derive(Clone)]
pub struct Instance(Arc<Shared>);

impl std::fmt::Debug for Instance {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Instance")
            .field("fd", &self.0.inotify.as_fd().as_raw_fd())
            .field("watches", &self.watches())
            .finish()
    }
}

/// The instance of each runtime that has one in use.
static INSTANCES: Mutex<Vec<(tokio::runtime::Id, Weak<Shared>)>> = Mutex::new(Vec::new());

impl Instance {
    /// The current tokio runtime's instance, created on first use.
    pub fn shared() -> Result<Self, Error> {
        let runtime = Handle::try_current().map_err(|_| Error::NoRuntime)?.id();
        let mut instances = INSTANCES.lock().unwrap_or_else(PoisonError::into_inner);
        instances.retain(|(_, weak)| weak.strong_count() > 0);
        if let Some(shared) = instances
            .iter()
            .find(|(id, _)| *id == runtime)
            .and_then(|(_, weak)| weak.upgrade())
        {
            return Ok(Self(shared));
        }
        let instance = Self::new()?;
        instances.push((runtime, Arc::downgrade(&instance.0)));
        Ok(instance)
    }

    /// A new instance of its own (not the runtime's shared one).
    pub fn new() -> Result<Self, Error> {
        let inotify =
            Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC).map_err(Error::Init)?;
        Ok(Self(Arc::new(Shared {
            inotify,
            state: Mutex::default(),
            idle: Notify::new(),
        })))
    }

    /// A subscriber with no watch yet; see [`Watch::add`].
    #[must_use]
    pub fn watch(&self) -> Watch {
        self.subscribe(None)
    }

    /// Like [`Instance::watch`], with events about directory entries limited to the names
    /// `filter` accepts.
    #[must_use]
    pub fn watch_filtered(&self, filter: NameFilter) -> Watch {
        self.subscribe(Some(filter))
    }

    fn subscribe(&self, filter: Option<NameFilter>) -> Watch {
        Watch {
            shared: self.0.clone(),
            subscriber: Arc::new(Subscriber::new(filter)),
            wds: Vec::new(),
        }
    }

    /// How many kernel watches (wds) the instance holds.
    #[must_use]
    pub fn watches(&self) -> usize {
        self.0.lock().registry.len()
    }

    /// Whether `self` and `other` are the same instance.
    #[must_use]
    pub fn same_as(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

/// One subscriber: a set of watched paths and one "something changed" signal for all of them.
/// Dropping it removes its watches.
pub struct Watch {
    shared: Arc<Shared>,
    subscriber: Arc<Subscriber>,
    /// One entry per successful add (a path added twice is removed twice).
    wds: Vec<WatchDescriptor>,
}

impl std::fmt::Debug for Watch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watch")
            .field("wds", &self.wds)
            .finish_non_exhaustive()
    }
}

impl Watch {
    /// Watches `path` (followed if a symlink) for the events in `mask` (flags such as
    /// `IN_ONLYDIR` apply; `IN_MASK_ADD` is implied, `IN_ONESHOT` must not be used). Must be
    /// called inside a tokio runtime: the first watch of an instance starts its reader there.
    pub fn add(&mut self, path: &Path, mask: AddWatchFlags) -> Result<(), Error> {
        let failed = |source: io::Error| Error::AddWatch {
            path: path.to_path_buf(),
            source,
        };
        // The inode's identity and the watch must be of the same file even if the path is
        // replaced meanwhile: watch the opened file through its /proc/self/fd link.
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_PATH)
            .open(path)
            .map_err(failed)?;
        let meta = file.metadata().map_err(failed)?;
        let link = PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()));
        let mut state = self.shared.lock();
        let wd = self
            .shared
            .inotify
            .add_watch(
                &link,
                mask | AddWatchFlags::from_bits_retain(libc::IN_MASK_ADD),
            )
            .map_err(|errno| failed(errno.into()))?;
        state
            .registry
            .add(wd, (meta.dev(), meta.ino()), &self.subscriber, mask);
        if let Err(err) = start_reader(&self.shared, &mut state) {
            self.release(&mut state, wd);
            return Err(err);
        }
        self.wds.push(wd);
        Ok(())
    }

    /// Drops one add of `wd`, and the kernel watch with its last subscriber.
    fn release(&self, state: &mut State, wd: WatchDescriptor) {
        if state.registry.remove(wd, &self.subscriber) {
            // EINVAL: the kernel dropped it already (its IN_IGNORED is queued).
            if self.shared.inotify.rm_watch(wd).is_ok() {
                state.registry.retired(wd);
            }
        }
    }

    /// Waits until something changed since the changes were last taken, and takes them.
    /// Cancel-safe: changes are only taken when returned. One waiter per `Watch` at a time
    /// (a second one may sleep through the first one's wake-up).
    pub async fn changed(&self) -> Result<Changes, Error> {
        loop {
            let changes = self.subscriber.take()?;
            if !changes.is_empty() {
                return Ok(changes);
            }
            self.subscriber.notify.notified().await;
        }
    }

    /// Takes the changes so far without waiting (empty if none).
    pub fn take(&self) -> Result<Changes, Error> {
        self.subscriber.take()
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let shared = self.shared.clone();
        let mut state = shared.lock();
        for wd in std::mem::take(&mut self.wds) {
            self.release(&mut state, wd);
        }
        if state.registry.is_empty() {
            shared.idle.notify_one();
        }
    }
}

/// Starts the instance's reader task on the current runtime unless one runs.
fn start_reader(shared: &Arc<Shared>, state: &mut State) -> Result<(), Error> {
    if state.reader.is_some() {
        return Ok(());
    }
    let runtime = Handle::try_current().map_err(|_| Error::NoRuntime)?;
    let fd = register_readable(SharedFd(shared.clone())).map_err(Error::Reader)?;
    state.generations += 1;
    let generation = state.generations;
    state.reader = Some(generation);
    runtime.spawn(read_events(ReaderRuns {
        fd: Some(fd),
        generation,
    }));
    Ok(())
}

/// The instance's descriptor, registered with tokio by its reader.
struct SharedFd(Arc<Shared>);

impl AsRawFd for SharedFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.inotify.as_fd().as_raw_fd()
    }
}

// The `Arc` keeps the `Inotify`, and so its descriptor, for as long as the value lives.
impl OwnsFd for SharedFd {}

/// A running reader: its registration with tokio, which goes when the reader stops, however
/// its task ends (returned, or dropped with its runtime). Registration and `State::reader`
/// change together under the instance's lock, so the next reader never finds the descriptor
/// still registered.
struct ReaderRuns {
    fd: Option<AsyncFd<SharedFd>>,
    generation: u64,
}

impl ReaderRuns {
    /// Deregisters and marks the reader stopped, with the instance's lock held.
    fn stop(&mut self, state: &mut State) {
        self.fd = None;
        if state.reader == Some(self.generation) {
            state.reader = None;
        }
    }
}

impl Drop for ReaderRuns {
    fn drop(&mut self) {
        let Some(shared) = self.fd.as_ref().map(|fd| fd.get_ref().0.clone()) else {
            return;
        };
        let mut state = shared.lock();
        self.stop(&mut state);
    }
}

/// The reader task: reads events while the instance holds watches and routes them.
async fn read_events(mut runs: ReaderRuns) {
    let Some(shared) = runs.fd.as_ref().map(|fd| fd.get_ref().0.clone()) else {
        return;
    };
    loop {
        let Some(fd) = runs.fd.as_ref() else {
            return;
        };
        let read = tokio::select! {
            ready = fd.readable() => match ready {
                Ok(mut guard) => match guard.try_io(|fd| fd.get_ref().0.inotify.read_events().map_err(io::Error::from)) {
                    Ok(read) => read,
                    Err(_would_block) => continue,
                },
                Err(error) => Err(error),
            },
            () = shared.idle.notified() => Ok(Vec::new()),
        };
        let mut state = shared.lock();
        match read {
            Ok(events) => {
                for event in &events {
                    state.registry.dispatch(Event {
                        wd: event.wd,
                        mask: event.mask,
                        name: event.name.as_deref(),
                    });
                }
            }
            Err(error) => {
                tracing::warn!(%error, "reading inotify events failed; watches of this instance stop");
                state.registry.fail_all(&Arc::new(error));
                return runs.stop(&mut state);
            }
        }
        if state.registry.is_empty() {
            return runs.stop(&mut state);
        }
    }
}
