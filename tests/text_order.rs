//! The executable's layout: the functions `link/text-order.txt` lists (what a server
//! runs from its start to idle, then what a call runs) come first in its code, together,
//! so that the little code an idle server has run sits in few pages. `build.rs` hands
//! the list to the linker where the linker is lld.

use std::collections::{HashMap, HashSet};

use object::{Object, ObjectSection, ObjectSymbol, SymbolKind};

#[test]
fn the_listed_functions_come_first_in_the_executables_code_and_together() {
    // Set by build.rs when it had the linker order the code.
    let Some(list) = option_env!("TOOLGATE_TEXT_ORDER_FILE") else {
        eprintln!(
            "skipped: this build's code is not ordered (the order needs lld, the linker of \
             Rust 1.90 and later on x86-64 Linux with glibc, and no TOOLGATE_TEXT_ORDER=0)"
        );
        return;
    };
    let list = std::fs::read_to_string(list).expect("link/text-order.txt");
    made_for_this_build(&list);
    let listed: Vec<&str> = list
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .collect();
    assert!(listed.len() > 1000, "the list names {} functions", listed.len());

    let data = std::fs::read(env!("CARGO_BIN_EXE_toolgate")).expect("the binary");
    let binary = object::File::parse(&*data).expect("an ELF file");
    let functions: Vec<(u64, &str)> = binary
        .symbols()
        .filter(|symbol| symbol.kind() == SymbolKind::Text && symbol.size() > 0)
        .filter_map(|symbol| Some((symbol.address(), symbol.name().ok()?)))
        .collect();
    // A name may be defined more than once (local copies of one generic function in
    // several code units); the linker puts every copy where the name is listed.
    let mut address: HashMap<&str, u64> = HashMap::new();
    for &(at, name) in &functions {
        address.entry(name).and_modify(|first| *first = (*first).min(at)).or_insert(at);
    }

    // A build keeps only some of the listed functions (this one is not the release
    // build the list was made from); those it keeps open the code, and no function
    // the list does not name comes among them.
    let kept: Vec<u64> = listed.iter().filter_map(|name| address.get(name).copied()).collect();
    assert!(
        kept.len() >= 50,
        "only {} of the listed functions are in the binary: the list is of another toolchain \
         or Cargo.lock; scripts/text-order makes it anew",
        kept.len()
    );
    let listed: HashSet<&str> = listed.into_iter().collect();
    let first = kept.iter().copied().min().expect("kept");
    let last = kept.iter().copied().max().expect("kept");
    let interlopers: Vec<&str> = functions
        .iter()
        .filter(|&&(at, name)| at < last && !listed.contains(name))
        .map(|&(_, name)| name)
        .collect();
    // The linker places input sections, and a few of the standard library's hold more
    // than one function: an unlisted function that shares one with a listed function
    // comes along with it. Without the order, thousands would be interleaved.
    assert!(
        interlopers.len() * 10 <= kept.len(),
        "{} unlisted functions are laid out among the listed ones, such as {:?}",
        interlopers.len(),
        &interlopers[..interlopers.len().min(5)]
    );
    let code = binary.section_by_name(".text").expect("a .text section");
    assert_eq!(first, code.address(), "the first listed function opens the code");
}

/// The names hold only for the toolchain and the `Cargo.lock` the list was made with
/// (a dependency added renames the crate's own functions too). An out-of-date list
/// still links, but orders little: idle memory grows by about 6 MiB without a word,
/// so it is caught here, with how to remake it.
fn made_for_this_build(list: &str) {
    use sha2::Digest;
    let header = |prefix: &str| {
        list.lines()
            .filter_map(|line| line.strip_prefix("# "))
            .find_map(|line| line.strip_prefix(prefix))
            .unwrap_or_else(|| panic!("link/text-order.txt has no '# {prefix}' line"))
    };
    let remake = "the list is out of date: run scripts/text-order (it builds the release \
                  binary and needs valgrind), then commit link/text-order.txt";
    if let Some(rustc) = option_env!("TOOLGATE_RUSTC_VERSION") {
        assert_eq!(header("made with: "), rustc, "{remake}");
    }
    let lock = std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.lock"))
        .unwrap_or_else(|err| panic!("Cargo.lock: {err}"));
    let hash: String =
        sha2::Sha256::digest(&lock).iter().map(|byte| format!("{byte:02x}")).collect();
    assert_eq!(header("Cargo.lock sha256: "), hash, "{remake}");
}
