//! `nvwc serve`'s binding of a cache to its backing store, with the live
//! server: a wrong backing store is refused and left untouched,
//! `--force-attach` rebinds, a damaged cache is refused, `nvwc format`
//! starts over, and upstream NBD backing stores are known by their identity
//! and label (`docs/ON-DISK-FORMAT.md`, "Binding").
//!
//! Needs Debian's `qemu-utils` and `libnbd-bin` (and `nbdkit` for the
//! upstream cases). Missing tools skip the test, or fail it when
//! `NVWC_REQUIRE_TOOLS=1` (CI).

mod common;
use common::require_tools;
use common::serve::*;

/// The scenario: a.img served through c.img, 1 MiB of 0xaa written
/// and flushed, `kill -9`; then the same cache with other.img (same size)
/// must refuse to start, naming both backing stores, and leave other.img
/// (and the cache) byte for byte as they were. The right backing store still
/// recovers the flushed data, and `nvwc flush` lands it there.
/// `--force-attach` binds the cache to other.img on purpose; then a.img is
/// the wrong one.
#[test]
fn bind_wrong_backing_is_refused_and_force_attach_rebinds() {
    require_tools!("qemu-io");
    let dir = tempdir_with("bind-file", "truncate -s 16M a.img other.img");
    let with = |backing: &'static str, extra: &[&'static str]| {
        let mut v = vec![
            "--backing",
            backing,
            "--cache",
            "c.img",
            "--cache-size",
            "8M",
        ];
        v.extend(extra);
        v
    };
    let s = start_with(&dir, &with("a.img", &[]));
    qemu_io(&dir, &["write -P 0xaa 0 1M", "flush"]);
    drop(s); // kill -9
    let (other, cache) = (read(&dir, "other.img"), read(&dir, "c.img"));
    let err = refused(&dir, &with("other.img", &[]));
    assert!(
        err.contains("belongs to another backing store")
            && err.contains(&format!(
                "bound to file {}/a.img (nvwc label ",
                dir.display()
            ))
            && err.contains(&format!(
                "given is file {}/other.img (no nvwc label",
                dir.display()
            ))
            && err.contains("256 dirty blocks")
            && err.contains("--force-attach")
            && err.contains("nvwc format --force --cache c.img"),
        "{err}"
    );
    assert!(read(&dir, "other.img") == other, "other.img was written");
    assert!(read(&dir, "c.img") == cache, "the cache was written");
    assert!(!dir.join("other.img.nvwc-redo").exists());

    // The right backing store: the flushed data is there, and a flush
    // writes it back to a.img (its data; the label lies past it).
    let s = start_with(&dir, &with("a.img", &[]));
    qemu_io(&dir, &["read -P 0xaa 0 1M"]);
    let (ok, out) = nvwc_in(&dir, &["flush"]);
    assert!(ok, "{out}");
    let a = read(&dir, "a.img");
    assert!(a[..1 << 20].iter().all(|&b| b == 0xaa), "not written back");
    assert_eq!(a.len(), (16 << 20) + 4096, "a.img carries its label");
    qemu_io(&dir, &["write -P 0xbb 1M 64k", "flush"]);
    drop(s);

    // On purpose: other.img takes the cache's dirty data. The clean copies
    // of a.img's blocks are dropped after the kill -9 (write-back recovery
    // keeps only dirty versions after a crash), so those blocks read from
    // other.img itself.
    let s = start_with(&dir, &with("other.img", &["--force-attach"]));
    qemu_io(&dir, &["read -P 0 0 1M", "read -P 0xbb 1M 64k"]);
    let (ok, out) = nvwc_in(&dir, &["flush"]);
    assert!(ok, "{out}");
    let o = read(&dir, "other.img");
    assert!(o[1 << 20..(1 << 20) + 65536].iter().all(|&b| b == 0xbb));
    drop(s);
    let err = refused(&dir, &with("a.img", &[]));
    assert!(
        err.contains(&format!("bound to file {}/other.img", dir.display())),
        "{err}"
    );
    // A new cache takes other.img over; from then on the old one is stale
    // there (its contents could overwrite what the new one wrote back).
    let s = start_with(
        &dir,
        &[
            "--backing",
            "other.img",
            "--cache",
            "d.img",
            "--cache-size",
            "8M",
        ],
    );
    qemu_io(
        &dir,
        &["read -P 0xbb 1M 64k", "write -P 0xdd 0 64k", "flush"],
    );
    drop(s);
    let cache = read(&dir, "c.img");
    let err = refused(&dir, &with("other.img", &[]));
    assert!(
        err.contains("c.img is stale for file")
            && err.contains("bound to another cache")
            && err.contains("It holds "),
        "{err}"
    );
    assert!(read(&dir, "c.img") == cache);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A cache whose superblock is damaged is refused and left as it is, and
/// so is a file that is not a cache; `nvwc format` without `--force`
/// refuses too; `nvwc format --force` starts over (the dirty data is gone,
/// the backing store's own data is served). A blank file is formatted.
/// `nvwc detach` empties the cache: the next start may use any backing store.
#[test]
fn bind_damaged_cache_refused_format_force_starts_over() {
    require_tools!("qemu-io");
    let dir = tempdir_with("bind-damaged", "truncate -s 16M a.img b.img && head -c 8M /dev/urandom > foreign.img && truncate -s 8M blank.img");
    let args =
        |cache: &'static str| vec!["--backing", "a.img", "--cache", cache, "--cache-size", "8M"];
    let s = start_with(&dir, &args("c.img"));
    qemu_io(&dir, &["write -P 0xaa 0 1M", "flush"]);
    drop(s); // kill -9
    let mut c = read(&dir, "c.img");
    c[100] ^= 0xff; // inside the superblock's CRC
    std::fs::write(dir.join("c.img"), &c).unwrap();
    let err = refused(&dir, &args("c.img"));
    assert!(
        err.contains("c.img: its superblock is damaged")
            && err.contains("not blank")
            && err.contains("nvwc format --force --cache c.img"),
        "{err}"
    );
    assert!(read(&dir, "c.img") == c, "a damaged cache was written");
    let (ok, out) = nvwc_in(&dir, &["format", "--cache", "c.img"]);
    assert!(!ok && out.contains("--force"), "{out}");
    assert!(read(&dir, "c.img") == c);

    let foreign = read(&dir, "foreign.img");
    let err = refused(&dir, &args("foreign.img"));
    assert!(err.contains("no nvwc superblock"), "{err}");
    assert!(
        read(&dir, "foreign.img") == foreign,
        "a foreign file was written"
    );

    let (ok, out) = nvwc_in(&dir, &["format", "--force", "--cache", "c.img"]);
    assert!(ok && out.contains("erased c.img"), "{out}");
    let s = start_with(&dir, &args("c.img"));
    qemu_io(&dir, &["read -P 0 0 1M", "write -P 0xcc 2M 64k", "flush"]);
    drop(s);
    let s = start_with(&dir, &args("c.img"));
    qemu_io(&dir, &["read -P 0xcc 2M 64k"]);
    // Detach: everything written back, the cache emptied.
    detach(&dir, s);
    assert!(read(&dir, "a.img")[2 << 20..(2 << 20) + 65536]
        .iter()
        .all(|&b| b == 0xcc));
    let (ok, out) = nvwc_in(&dir, &["format", "--cache", "c.img"]);
    assert!(ok && out.contains("emptied"), "{out}");
    // An emptied cache serves another backing store, with nothing of a.img.
    let s = start_with(
        &dir,
        &[
            "--backing",
            "b.img",
            "--cache",
            "c.img",
            "--cache-size",
            "8M",
        ],
    );
    qemu_io(&dir, &["read -P 0 2M 64k"]);
    drop(s);
    // A blank (all-zero) file is a new cache.
    let s = start_with(&dir, &args("blank.img"));
    qemu_io(&dir, &["read -P 0xcc 2M 64k"]);
    drop(s);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Upstream NBD backing stores: write-back over upstream A, then another
/// upstream (other socket, same size) is refused and untouched. Journaled
/// over A keeps a label in A's redo region: when another server takes A's
/// socket (same URI, same size, no region), the start is refused, and no
/// redo region is created on it; with A back, the flushed data is there.
#[test]
fn bind_upstream_nbd_identity_and_label() {
    require_tools!("nbdkit", "qemu-io");
    let dir = tempdir_with("bind-up", "truncate -s 64M up.img other.img");
    fn refs(v: &[String]) -> Vec<&str> {
        v.iter().map(String::as_str).collect()
    }
    let uri = |sock: &str| format!("nbd+unix:///?socket={}", dir.join(sock).display());
    let (a_uri, b_uri) = (uri("a.sock"), uri("b.sock"));
    let args = |u: &str, policy: &'static str, cache: &'static str| -> Vec<String> {
        ["--backing", u, "--cache", cache, "--cache-size", "8M"]
            .into_iter()
            .map(String::from)
            .chain(["--write-policy".into(), policy.into()])
            .collect()
    };
    let up_a = nbdkit_file(&dir, "up.img", "a.sock");
    let up_b = nbdkit_file(&dir, "other.img", "b.sock");

    let wb = args(&a_uri, "write-back", "wb.img");
    let s = start_with(&dir, &refs(&wb));
    qemu_io(&dir, &["write -P 0xaa 0 1M", "flush"]);
    drop(s);
    let other = read(&dir, "other.img");
    let err = refused(&dir, &refs(&args(&b_uri, "write-back", "wb.img")));
    assert!(
        err.contains(&format!(
            "bound to NBD export \"\" at {a_uri} (no nvwc label"
        )) && err.contains(&format!("given is NBD export \"\" at {b_uri}"))
            && err.contains("256 dirty blocks"),
        "{err}"
    );
    assert!(
        read(&dir, "other.img") == other,
        "the other upstream was written"
    );
    let s = start_with(&dir, &refs(&wb));
    qemu_io(&dir, &["read -P 0xaa 0 1M"]);
    drop(s);

    let j = args(&a_uri, "journaled", "j.img");
    let s = start_with(&dir, &refs(&j));
    qemu_io(&dir, &["write -P 0x5c 4M 1M", "flush"]);
    drop(s);
    // Another store at A's socket.
    drop(up_a);
    let imposter = nbdkit_file(&dir, "other.img", "a.sock");
    let err = refused(&dir, &refs(&j));
    assert!(
        err.contains(&format!("bound to NBD export \"\" at {a_uri} (nvwc label "))
            && err.contains(&format!(
                "given is NBD export \"\" at {a_uri} (no nvwc label"
            )),
        "{err}"
    );
    assert!(
        read(&dir, "other.img") == other,
        "a redo region or label was written on the wrong upstream"
    );
    drop(imposter);
    let up_a = nbdkit_file(&dir, "up.img", "a.sock");
    let s = start_with(&dir, &refs(&j));
    qemu_io(&dir, &["read -P 0x5c 4M 1M"]);
    drop(s);
    // The upstream alone after losing the cache: recover names the binding.
    let (ok, out) = nvwc_in(&dir, &["recover", "--backing", &a_uri]);
    assert!(ok && out.contains("is bound to cache"), "{out}");
    drop((up_a, up_b));
    let _ = std::fs::remove_dir_all(&dir);
}
