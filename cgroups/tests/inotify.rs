//! The shared inotify instance on real files: many subscribers on one instance each get their
//! own events, masks of one inode add up, a removed directory's subscribers are told, a
//! subscriber that does not wait loses no change, and the reader stops and starts again with
//! its watches (also across runtimes). No root needed.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use common::{inotify_descriptors_of_this_process, within};
use ironlet_cgroups::inotify::{Changes, Instance, Watch};
use nix::sys::inotify::AddWatchFlags;

const MODIFY: AddWatchFlags = AddWatchFlags::IN_MODIFY;
const ATTRIB: AddWatchFlags = AddWatchFlags::IN_ATTRIB;

fn append(path: &Path, text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    let mut file = std::fs::OpenOptions::new().append(true).open(path)?;
    file.write_all(text.as_bytes())?;
    Ok(())
}

fn watch(instance: &Instance, path: &Path, mask: AddWatchFlags) -> anyhow::Result<Watch> {
    let mut watch = instance.watch();
    watch.add(path, mask)?;
    Ok(watch)
}

/// Waits a little for stray events, then takes what came.
async fn settled(watch: &Watch) -> anyhow::Result<Changes> {
    tokio::time::sleep(Duration::from_millis(200)).await;
    Ok(watch.take()?)
}

/// Waits until `watch` is told `removed`; the changes until then, together.
async fn until_removed(watch: &Watch) -> anyhow::Result<Changes> {
    let mut all = Changes::default();
    while !all.removed {
        let changes = watch.changed().await?;
        all.events |= changes.events;
        all.removed |= changes.removed;
        all.overflowed |= changes.overflowed;
    }
    Ok(all)
}

#[tokio::test]
async fn two_hundred_watches_share_one_instance_and_each_gets_only_its_own_events(
) -> anyhow::Result<()> {
    const FILES: usize = 200;
    let dir = tempfile::tempdir()?;
    let instance = Instance::shared()?;
    let mut watches = Vec::new();
    for n in 0..FILES {
        let file = dir.path().join(format!("{n}"));
        std::fs::write(&file, "")?;
        watches.push((file.clone(), watch(&instance, &file, MODIFY)?));
    }
    assert_eq!(instance.watches(), FILES);
    assert!(
        Instance::shared()?.same_as(&instance),
        "two instances in one runtime"
    );
    // One instance per runtime: the other tests of this binary may hold theirs.
    let held = inotify_descriptors_of_this_process()?;
    assert!(
        held < 10,
        "{held} inotify descriptors for {FILES} watches: not shared"
    );
    for (n, (file, watch)) in watches.iter().enumerate().step_by(7) {
        append(file, "x")?;
        let changes = within(5, "a watched file's modification", watch.changed()).await?;
        assert_eq!(changes.events, MODIFY, "watch {n}");
    }
    for (n, (_, watch)) in watches.iter().enumerate() {
        let changes = watch.take()?;
        assert!(
            changes.is_empty(),
            "watch {n} got another file's event: {changes:?}"
        );
    }
    drop(watches);
    assert_eq!(instance.watches(), 0);
    Ok(())
}

#[tokio::test]
async fn two_masks_on_one_file_add_up_and_each_subscriber_sees_its_own() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("f");
    std::fs::write(&file, "")?;
    let instance = Instance::new()?;
    let writes = watch(&instance, &file, MODIFY)?;
    let chmods = watch(&instance, &file, ATTRIB)?;
    assert_eq!(instance.watches(), 1, "one inode, one wd");

    // Without IN_MASK_ADD the second add would have replaced IN_MODIFY.
    append(&file, "x")?;
    assert_eq!(
        within(5, "IN_MODIFY", writes.changed()).await?.events,
        MODIFY
    );
    assert!(settled(&chmods).await?.is_empty());
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600))?;
    assert_eq!(
        within(5, "IN_ATTRIB", chmods.changed()).await?.events,
        ATTRIB
    );
    assert!(settled(&writes).await?.is_empty());

    // The wd stays for the remaining subscriber, and goes with the last.
    drop(chmods);
    assert_eq!(instance.watches(), 1);
    append(&file, "y")?;
    assert_eq!(
        within(
            5,
            "IN_MODIFY after the other subscriber left",
            writes.changed()
        )
        .await?
        .events,
        MODIFY
    );
    drop(writes);
    assert_eq!(instance.watches(), 0);
    Ok(())
}

#[tokio::test]
async fn identical_watches_are_counted_and_the_wd_goes_with_the_last() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("f");
    std::fs::write(&file, "")?;
    let instance = Instance::new()?;
    let first = watch(&instance, &file, MODIFY)?;
    let mut second = watch(&instance, &file, MODIFY)?;
    // The same file twice through one subscriber, once through a symlink.
    let link = dir.path().join("link");
    std::os::unix::fs::symlink(&file, &link)?;
    second.add(&link, MODIFY)?;
    assert_eq!(instance.watches(), 1);
    drop(first);
    append(&file, "x")?;
    assert_eq!(
        within(5, "IN_MODIFY for the second subscriber", second.changed())
            .await?
            .events,
        MODIFY
    );
    drop(second);
    assert_eq!(instance.watches(), 0);
    Ok(())
}

#[tokio::test]
async fn a_removed_directorys_subscribers_are_told_and_no_one_else() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let (gone, stays) = (dir.path().join("gone"), dir.path().join("stays"));
    std::fs::create_dir(&gone)?;
    std::fs::create_dir(&stays)?;
    std::fs::write(gone.join("events"), "")?;
    let instance = Instance::new()?;
    let self_events = AddWatchFlags::IN_DELETE_SELF | AddWatchFlags::IN_ONLYDIR;
    // A cgroup watcher's shape: the file for changes, the directory for its removal.
    let mut file_and_dir = instance.watch();
    file_and_dir.add(&gone.join("events"), MODIFY)?;
    file_and_dir.add(&gone, self_events)?;
    let entries = watch(
        &instance,
        &gone,
        AddWatchFlags::IN_CREATE | AddWatchFlags::IN_DELETE,
    )?;
    let other = watch(&instance, &stays, self_events | AddWatchFlags::IN_CREATE)?;
    assert_eq!(instance.watches(), 3);

    std::fs::remove_dir_all(&gone)?;
    let both = within(
        5,
        "the removed directory's IN_IGNORED",
        until_removed(&file_and_dir),
    )
    .await?;
    assert!(
        both.events.contains(AddWatchFlags::IN_DELETE_SELF),
        "{both:?}"
    );
    let entries_changes = within(
        5,
        "IN_IGNORED to the entries' watcher",
        until_removed(&entries),
    )
    .await?;
    assert!(
        entries_changes.events.contains(AddWatchFlags::IN_DELETE),
        "{entries_changes:?}"
    );
    assert!(settled(&other).await?.is_empty());
    assert_eq!(
        instance.watches(),
        1,
        "the removed directory's wds are gone"
    );

    // A directory of the same name made afterwards is a new watch, its own.
    std::fs::create_dir(&gone)?;
    let fresh = watch(&instance, &gone, AddWatchFlags::IN_CREATE)?;
    std::fs::write(gone.join("new"), "")?;
    assert_eq!(
        within(5, "the new directory's IN_CREATE", fresh.changed())
            .await?
            .events,
        AddWatchFlags::IN_CREATE
    );
    assert!(settled(&file_and_dir).await?.is_empty() && entries.take()?.is_empty());
    assert!(other.take()?.is_empty());
    Ok(())
}

#[tokio::test]
async fn a_subscriber_that_was_not_waiting_loses_no_change_and_gets_one_wake_up(
) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("f");
    std::fs::write(&file, "")?;
    let instance = Instance::new()?;
    let lagging = watch(&instance, &file, MODIFY)?;
    for _ in 0..1000 {
        append(&file, "x")?;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        within(1, "the changes made before the wait", lagging.changed())
            .await?
            .events,
        MODIFY
    );
    let again = tokio::time::timeout(Duration::from_millis(300), lagging.changed()).await;
    assert!(
        again.is_err(),
        "a second wake-up for changes already taken: {again:?}"
    );
    Ok(())
}

#[tokio::test]
async fn the_reader_stops_with_the_last_watch_and_starts_again_with_the_next() -> anyhow::Result<()>
{
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("f");
    std::fs::write(&file, "")?;
    let instance = Instance::new()?;
    for round in 0..3 {
        let w = watch(&instance, &file, MODIFY)?;
        append(&file, "x")?;
        let changes = within(5, "IN_MODIFY after the reader restarted", w.changed()).await?;
        assert_eq!(changes.events, MODIFY, "round {round}");
        drop(w);
        // Let the reader see it has nothing left.
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(instance.watches(), 0);
    }
    Ok(())
}

/// The instance of a runtime that shut down while its watches lived on is not left without a
/// reader for the runtime that comes next.
#[test]
fn watches_work_on_a_runtime_made_after_another_shut_down() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("f");
    std::fs::write(&file, "")?;
    let mut kept = Vec::new();
    for round in 0..3 {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        runtime.block_on(async {
            let w = watch(&Instance::shared()?, &file, MODIFY)?;
            append(&file, "x")?;
            let changes = within(5, "IN_MODIFY on a later runtime", w.changed()).await?;
            assert_eq!(changes.events, MODIFY, "round {round}");
            // Outlives its runtime, with its wd.
            kept.push(w);
            anyhow::Ok(())
        })?;
        drop(runtime);
    }
    Ok(())
}

/// When the shared queue overflows (`fs.inotify.max_queued_events`), events are lost for
/// every watch of the instance: each subscriber, the quiet ones too, is told to re-check.
#[tokio::test(flavor = "current_thread")]
async fn a_queue_overflow_tells_every_subscriber_to_re_check() -> anyhow::Result<()> {
    use std::io::Write;
    let queued: usize = std::fs::read_to_string("/proc/sys/fs/inotify/max_queued_events")?
        .trim()
        .parse()?;
    let dir = tempfile::tempdir()?;
    let (a, b, quiet) = (
        dir.path().join("a"),
        dir.path().join("b"),
        dir.path().join("q"),
    );
    for file in [&a, &b, &quiet] {
        std::fs::write(file, "")?;
    }
    let instance = Instance::new()?;
    let (wa, wb, wq) = (
        watch(&instance, &a, MODIFY)?,
        watch(&instance, &b, MODIFY)?,
        watch(&instance, &quiet, MODIFY)?,
    );
    // The reader shares this thread: it reads nothing until the test yields. Alternating
    // files keeps the kernel from merging the events.
    let mut files = [
        std::fs::OpenOptions::new().append(true).open(&a)?,
        std::fs::OpenOptions::new().append(true).open(&b)?,
    ];
    for n in 0..queued + 100 {
        files[n % 2].write_all(b"x")?;
    }
    let changes = within(5, "the overflow", wq.changed()).await?;
    assert!(changes.overflowed, "{changes:?}");
    for w in [&wa, &wb] {
        let changes = w.take()?;
        assert!(
            changes.overflowed && changes.events == MODIFY,
            "{changes:?}"
        );
    }
    // The watches go on after it.
    files[0].write_all(b"x")?;
    let after = within(5, "IN_MODIFY after the overflow", async {
        loop {
            let changes = wa.changed().await?;
            if !changes.overflowed {
                return anyhow::Ok(changes);
            }
        }
    })
    .await?;
    assert_eq!(after.events, MODIFY);
    Ok(())
}
