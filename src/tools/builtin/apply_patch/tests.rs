//! The journal under simulated crashes: a commit stopped dead at each of its steps
//! (as kill -9 would stop it: no cleanup runs, the journal's lock goes with the
//! process), then recovered, leaves every file old or every file new.

use std::collections::BTreeMap;
use std::path::Path;

use super::*;

/// A root with `count` files the session has read, and a journal directory.
struct Setup {
    _dir: tempfile::TempDir,
    root: PathBuf,
    journal: PathBuf,
    env: Env,
}

fn setup(count: usize) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(dir.path()).unwrap().join("root");
    std::fs::create_dir_all(root.join("src")).unwrap();
    let journal = dir.path().join("state").join("patches");
    for idx in 0..count {
        let body = format!("// file {idx}\nfn f{idx}() {{\n\tlet x = {idx};\r\n}}\n");
        std::fs::write(root.join(format!("src/f{idx}.rs")), body).unwrap();
    }
    let env = Env::for_root(&root).unwrap();
    for idx in 0..count {
        let path = root.join(format!("src/f{idx}.rs"));
        let bytes = std::fs::read(&path).unwrap();
        let info = fs::file_info(std::fs::File::open(&path).unwrap()).unwrap();
        env.files.record(path, FileStamp::of(&info, &bytes));
    }
    Setup { _dir: dir, root, journal, env }
}

/// Updates 17 files, deletes one, moves one and adds one: 20 files, three kinds of
/// change.
fn twenty_file_patch() -> String {
    let mut patch = String::from("*** Begin Patch\n");
    for idx in 0..17 {
        patch.push_str(&format!(
            "*** Update File: src/f{idx}.rs\n@@ fn f{idx}() {{\n-\tlet x = {idx};\n+\tlet x = {idx} + 1;\n"
        ));
    }
    patch.push_str("*** Delete File: src/f17.rs\n");
    patch.push_str("*** Update File: src/f18.rs\n*** Move to: src/moved.rs\n@@\n-// file 18\n+// file 18, moved\n");
    patch.push_str("*** Add File: src/new.rs\n+pub fn added() {}\n");
    patch.push_str("*** End Patch\n");
    patch
}

/// Every file under `root` and its bytes.
fn snapshot(root: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut files = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let entry = entry.unwrap();
            let path = entry.path();
            if entry.file_type().unwrap().is_dir() {
                stack.push(path);
            } else {
                let rel = path.strip_prefix(root).unwrap().display().to_string();
                files.insert(rel, std::fs::read(&path).unwrap());
            }
        }
    }
    files
}

fn apply_sync(
    setup: &Setup,
    patch: &str,
    crash_at: &mut dyn FnMut(Step) -> bool,
) -> Result<ToolResult, FsError> {
    let ops = parse::parse(patch).unwrap();
    let names = names_of(&ops);
    let targets = names
        .iter()
        .map(|name| {
            fs::resolve_for_write(&setup.env, name, ParentDirs::Create).map(|t| Some(Arc::new(t)))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let targets = Targets::new(&names, targets);
    let cancel = CancellationToken::new();
    settle(&setup.env, &ops, &targets, false, &cancel, &setup.journal, crash_at)
}

#[test]
fn a_crash_at_any_step_recovers_to_all_old_or_all_new() {
    let patch = twenty_file_patch();
    // The reference run: how many steps a commit takes, and the new state.
    let reference = setup(19);
    let old = snapshot(&reference.root);
    let mut steps = 0;
    let res = apply_sync(&reference, &patch, &mut |_| {
        steps += 1;
        false
    })
    .unwrap();
    assert!(res.ok, "{res:#?}");
    let new = snapshot(&reference.root);
    assert_ne!(old, new);
    assert_eq!(new.get("src/f3.rs").unwrap(), b"// file 3\nfn f3() {\n\tlet x = 3 + 1;\r\n}\n");
    assert!(!new.contains_key("src/f17.rs") && new.contains_key("src/moved.rs"));
    assert!(new.contains_key("src/new.rs"));

    // Every step once, then pseudo-random ones, 50 crashes or more in all.
    let mut points: Vec<usize> = (0..steps).collect();
    let mut seed = 0x2545_F491_4F6C_DD1Du64;
    while points.len() < 50 {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        points.push(usize::try_from(seed % steps as u64).unwrap());
    }
    let (mut saw_old, mut saw_new) = (0, 0);
    for point in points {
        let run = setup(19);
        let mut step = 0;
        let outcome = apply_sync(&run, &patch, &mut |_| {
            step += 1;
            step == point + 1
        });
        assert!(matches!(&outcome, Err(FsError::Io { .. })), "crash at {point}: {outcome:?}");
        let report = journal::recover(&run.journal).unwrap();
        assert_eq!(report.in_use, 0);
        let after = snapshot(&run.root);
        if after == old {
            saw_old += 1;
        } else {
            assert_eq!(after, new, "a crash at step {point} left a mixed state");
            saw_new += 1;
        }
        assert!(
            !after.keys().any(|name| name.ends_with(".tmp")),
            "staged files left behind after a crash at step {point}"
        );
        let left: Vec<_> = std::fs::read_dir(&run.journal).unwrap().collect();
        assert!(left.is_empty(), "journals left behind: {left:?}");
        // A second recovery finds nothing to do.
        assert_eq!(journal::recover(&run.journal).unwrap(), journal::Recovery::default());
    }
    assert!(saw_old > 0 && saw_new > 0, "old {saw_old}, new {saw_new}");
}

#[test]
fn a_journal_held_by_a_live_writer_is_left_alone() {
    let run = setup(3);
    let patch =
        "*** Begin Patch\n*** Update File: src/f0.rs\n@@\n-// file 0\n+// zero\n*** End Patch\n";
    let mut checked = false;
    let journal_dir = run.journal.clone();
    let outcome = apply_sync(&run, patch, &mut |step| {
        if step == Step::Staged(0) {
            // Mid-commit, another process's recovery must not touch this patch.
            let report = journal::recover(&journal_dir).unwrap();
            assert_eq!(report.in_use, 1);
            assert_eq!(report.rolled_back + report.rolled_forward, 0);
            checked = true;
        }
        false
    })
    .unwrap();
    assert!(outcome.ok, "{outcome:#?}");
    assert!(checked);
    assert!(std::fs::read_to_string(run.root.join("src/f0.rs")).unwrap().starts_with("// zero"));
}
