//! Binding a cache to its backing store (`docs/ON-DISK-FORMAT.md`,
//! "Binding"): which backing store a cache may serve, decided before
//! anything is written to either.
//!
//! The superblock records the backing store's identity ([`BackingId`]):
//! kind, size, where it was, an upstream's export name, and the uuid of the
//! label nvwc keeps on it ([`crate::label`]). The label names the cache
//! bound to it. [`decide`] compares the two and returns the writes that
//! bind them ([`Plan`]), or why the server must not start ([`BindError`]).

use std::path::{Path, PathBuf};

use nvwc_core::layout::{uuid_string, BackingId, BackingKind, Superblock};

use crate::label::Label;

/// Why a server refuses to open a cache. Each message names what was found
/// and what to do; none wraps another error.
#[derive(Debug, thiserror::Error)]
pub enum BindError {
    #[error(
        "cache {cache}: {what}, and the device is not blank, so it may hold data a backing store \
         still needs: it is not formatted over. If nothing on it is needed, start it over with \
         `nvwc format --force --cache {cache}`"
    )]
    Damaged { cache: String, what: String },
    #[error(
        "cache {cache} was written by a newer nvwc (format version {version}); this one opens \
         versions {min} to {max}"
    )]
    Newer {
        cache: String,
        version: u32,
        min: u32,
        max: u32,
    },
    #[error(
        "cache {cache} belongs to another backing store: it is bound to {bound}, but the backing \
         store given is {given}.{dirty} Start it with the backing store it belongs to. If the \
         given one IS that store (moved or copied on purpose), add --force-attach to bind the \
         cache to it; to throw the cache's contents away instead, run \
         `nvwc format --force --cache {cache}`"
    )]
    Mismatch {
        cache: String,
        bound: String,
        given: String,
        /// " It holds N dirty blocks ..." or empty.
        dirty: String,
    },
    #[error(
        "cache {cache} is stale for {given}: that backing store has been bound to another cache \
         (uuid {other:016x}) since this one last used it, so writing this cache's contents back \
         could overwrite newer data.{dirty} If this cache's contents are the ones to keep, add \
         --force-attach; otherwise run `nvwc format --force --cache {cache}`"
    )]
    Stale {
        cache: String,
        given: String,
        other: u64,
        dirty: String,
    },
}

/// The backing store as opened, before anything was written to it.
#[derive(Clone, Debug)]
pub struct Given {
    /// Its identity now: `uuid` is its label's (zero without one), `size`
    /// is measured, `location` is the path or URI given.
    pub id: BackingId,
    /// `id.location` and `id.name` whole (the identity may hold prefixes).
    pub location: String,
    pub name: String,
    pub label: Option<Label>,
    /// A label can be written on it (a file; an upstream with a redo region,
    /// or one that gets a region at this start).
    pub can_label: bool,
    /// Other names of the same store (a block device's `/dev/disk/by-id`
    /// links and its canonical path), matched against a recorded location.
    pub aliases: Vec<String>,
}

/// The cache as found.
#[derive(Clone, Copy, Debug)]
pub enum Cache<'a> {
    /// Formatted at this start (new, blank, or emptied): holds nothing.
    Fresh { uuid: u64 },
    /// A cache that may hold data (bound, or formatted before binding existed).
    Existing(&'a Superblock),
}

/// How the binding came about, for the log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reason {
    /// Already bound to this backing store: nothing to write.
    Same,
    /// A fresh cache bound to the store.
    Fresh,
    /// A fresh cache bound to a store that another cache was bound to
    /// (that cache is refused from now on).
    TookOver { from: u64 },
    /// A cache formatted before binding existed, bound on its first open.
    Adopted,
    /// The label says this store is the one, but it was found elsewhere (an
    /// upstream reached by another URI, a file at another path).
    Moved { from: String },
    /// The store's label had been released (no cache): bound again.
    Reclaimed,
    /// The store had no label and can carry one now.
    Labelled,
    /// `--force-attach` over a mismatch.
    Forced { was: String },
}

/// The writes that bind the cache: the label first (made durable), then the
/// superblock (made durable), both before any request is served.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// `(backing uuid, cache uuid)` to write as the label, if it must change.
    pub label: Option<([u8; 16], u64)>,
    /// What the superblock must record.
    pub id: BackingId,
    pub reason: Reason,
}

/// Whether a backing store that carries no label is the recorded one:
/// same kind, same size, and the same place (an upstream's URI and export
/// name; a block device's recorded name among its names now).
fn same_unlabelled(rec: &BackingId, g: &Given) -> bool {
    rec.kind == g.id.kind
        && rec.size == g.id.size
        && match rec.kind {
            BackingKind::Nbd => rec.location.is(&g.location) && rec.name.is(&g.name),
            BackingKind::Block => g.aliases.iter().any(|a| rec.location.is(a)),
            // A file is always labelled when bound: without its label it is
            // not the same file as far as nvwc can tell.
            BackingKind::File => false,
        }
}

/// Decide how cache `cache` may serve backing store `g`. `new_uuid` makes a
/// uuid for a label written for the first time. `force` is `--force-attach`.
/// Errors carry no dirty-block count; the caller adds it.
pub fn decide(
    cache_name: &str,
    cache: Cache<'_>,
    g: &Given,
    force: bool,
    new_uuid: &mut dyn FnMut() -> [u8; 16],
) -> Result<Plan, BindError> {
    let with_uuid = |uuid: [u8; 16]| BackingId {
        uuid,
        ..g.id.clone()
    };
    // A label naming `c`, on the store as it is (keeping its uuid) or new.
    let mut label_for = |c: u64| -> (Option<([u8; 16], u64)>, [u8; 16]) {
        match g.label {
            Some(l) if l.cache == c => (None, l.uuid),
            Some(l) => (Some((l.uuid, c)), l.uuid),
            None if g.can_label => {
                let u = new_uuid();
                (Some((u, c)), u)
            }
            None => (None, [0; 16]),
        }
    };
    let (c, sb) = match cache {
        Cache::Fresh { uuid } => {
            let (label, u) = label_for(uuid);
            let reason = match g.label {
                Some(l) if l.cache != 0 && l.cache != uuid => Reason::TookOver { from: l.cache },
                _ => Reason::Fresh,
            };
            return Ok(Plan {
                label,
                id: with_uuid(u),
                reason,
            });
        }
        Cache::Existing(sb) => (sb.uuid, sb),
    };
    let stale = |other: u64| BindError::Stale {
        cache: cache_name.to_string(),
        given: g.id.to_string(),
        other,
        dirty: String::new(),
    };
    let Some(rec) = &sb.backing else {
        // Formatted before binding existed: bind on this first open, unless
        // the store belongs to another cache.
        if let Some(l) = g.label.filter(|l| l.cache != 0 && l.cache != c) {
            if !force {
                return Err(stale(l.cache));
            }
        }
        let (label, u) = label_for(c);
        return Ok(Plan {
            label,
            id: with_uuid(u),
            reason: Reason::Adopted,
        });
    };
    let mismatch = || BindError::Mismatch {
        cache: cache_name.to_string(),
        bound: rec.to_string(),
        given: g.id.to_string(),
        dirty: String::new(),
    };
    // A store that had no label gets a new uuid: the one the cache was bound
    // to (perhaps still on the old store) no longer matches it.
    let forced = |(label, u): (Option<([u8; 16], u64)>, [u8; 16])| Plan {
        label,
        id: with_uuid(u),
        reason: Reason::Forced {
            was: rec.to_string(),
        },
    };
    let ours = match g.label {
        Some(l) if rec.labelled() => l.uuid == rec.uuid && rec.kind == g.id.kind,
        _ => !rec.labelled() && same_unlabelled(rec, g),
    };
    if !ours {
        return if force {
            Ok(forced(label_for(c)))
        } else {
            Err(mismatch())
        };
    }
    match g.label {
        Some(l) if l.cache != c && l.cache != 0 => {
            if !force {
                return Err(stale(l.cache));
            }
            Ok(forced(label_for(c)))
        }
        Some(l) => {
            let reason = if l.cache == 0 {
                Reason::Reclaimed
            } else if !rec.labelled() {
                // Bound while the store had no label; it has ours now.
                Reason::Labelled
            } else if !rec.location.is(&g.location) || !rec.name.is(&g.name) {
                Reason::Moved {
                    from: rec.location.to_string(),
                }
            } else {
                Reason::Same
            };
            let (label, u) = label_for(c);
            Ok(Plan {
                label,
                id: with_uuid(u),
                reason,
            })
        }
        None => {
            // The recorded store, unlabelled; label it if it can carry one now.
            let (label, u) = label_for(c);
            Ok(Plan {
                reason: if label.is_some() {
                    Reason::Labelled
                } else {
                    Reason::Same
                },
                label,
                id: with_uuid(u),
            })
        }
    }
}

/// The names of a block device: its `/dev/disk/by-id` links (a `wwn-` one
/// first), then its canonical path. The first is what a superblock records.
pub fn block_names(path: &Path) -> Vec<String> {
    let canon = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    let mut ids: Vec<String> = std::fs::read_dir("/dev/disk/by-id")
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| std::fs::canonicalize(e.path()).ok().as_deref() == Some(canon.as_path()))
        .map(|e| e.path().display().to_string())
        .collect();
    ids.sort_by_key(|n| (!n.contains("/wwn-"), n.clone()));
    ids.push(canon.display().to_string());
    let given = path.display().to_string();
    if !ids.contains(&given) {
        ids.push(given);
    }
    ids
}

/// A path as shown in an identity: canonical when it can be resolved.
pub fn shown_path(path: &Path) -> PathBuf {
    std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf())
}

/// " It holds N dirty blocks ..." for an error message (empty for none or unknown).
pub fn dirty_note(dirty: Option<u64>) -> String {
    match dirty {
        Some(0) => " It holds no dirty blocks.".to_string(),
        Some(n) => format!(
            " It holds {n} dirty block{} that the backing store it is bound to has not received.",
            if n == 1 { "" } else { "s" }
        ),
        None => String::new(),
    }
}

/// A label's cache uuid for messages.
pub fn cache_name(uuid: u64) -> String {
    format!("{uuid:016x}")
}

/// A label for messages.
pub fn label_name(l: &Label) -> String {
    uuid_string(&l.uuid)
}

#[cfg(test)]
mod tests {
    use super::*;
    use nvwc_core::{layout::FORMAT_VERSION, WritePolicyKind};

    const C: u64 = 0xc0ffee;
    const X: [u8; 16] = [1; 16];
    const Y: [u8; 16] = [2; 16];
    const NEW: [u8; 16] = [9; 16];

    fn file(path: &str, label: Option<([u8; 16], u64)>, size: u64) -> Given {
        let uuid = label.map_or([0; 16], |l| l.0);
        Given {
            id: BackingId::new(BackingKind::File, uuid, size, path, ""),
            location: path.into(),
            name: String::new(),
            label: label.map(|(uuid, cache)| Label {
                uuid,
                cache,
                data_len: size,
                offset: size,
            }),
            can_label: true,
            aliases: vec![],
        }
    }

    fn nbd(uri: &str, label: Option<([u8; 16], u64)>, can_label: bool) -> Given {
        let uuid = label.map_or([0; 16], |l| l.0);
        Given {
            id: BackingId::new(BackingKind::Nbd, uuid, 1 << 20, uri, ""),
            location: uri.into(),
            name: String::new(),
            label: label.map(|(uuid, cache)| Label {
                uuid,
                cache,
                data_len: 1 << 19,
                offset: 1 << 20,
            }),
            can_label,
            aliases: vec![],
        }
    }

    fn sb(backing: Option<BackingId>) -> Superblock {
        let cfg = nvwc_core::Config::new(4096, 64, 1 << 20, WritePolicyKind::WriteBack);
        let mut sb = Superblock::for_config(&cfg, C);
        assert_eq!(sb.version, FORMAT_VERSION);
        sb.backing = backing;
        sb
    }

    fn run(cache: Cache<'_>, g: &Given, force: bool) -> Result<Plan, BindError> {
        decide("c.img", cache, g, force, &mut || NEW)
    }

    #[test]
    fn fresh_caches_label_the_store_or_take_it_over() {
        let p = run(Cache::Fresh { uuid: C }, &file("/a", None, 4096), false).unwrap();
        assert_eq!(
            (p.label, p.id.uuid, p.reason),
            (Some((NEW, C)), NEW, Reason::Fresh)
        );
        let p = run(
            Cache::Fresh { uuid: C },
            &file("/a", Some((X, 0)), 4096),
            false,
        )
        .unwrap();
        assert_eq!((p.label, p.id.uuid), (Some((X, C)), X));
        let p = run(
            Cache::Fresh { uuid: C },
            &file("/a", Some((X, 5)), 4096),
            false,
        )
        .unwrap();
        assert_eq!(p.reason, Reason::TookOver { from: 5 });
        assert_eq!(p.label, Some((X, C)));
        // An upstream without a region carries no label.
        let p = run(
            Cache::Fresh { uuid: C },
            &nbd("nbd://h/", None, false),
            false,
        )
        .unwrap();
        assert_eq!((p.label, p.id.labelled()), (None, false));
    }

    #[test]
    fn a_bound_cache_refuses_another_store_unless_forced() {
        let a = file("/a", Some((X, C)), 4096);
        let s = sb(Some(a.id.clone()));
        let p = run(Cache::Existing(&s), &a, false).unwrap();
        assert_eq!((p.label, p.reason), (None, Reason::Same));
        // The wrong-backing case: an unlabelled file of the same size.
        let other = file("/other", None, 4096);
        let e = run(Cache::Existing(&s), &other, false).unwrap_err();
        let m = e.to_string();
        assert!(matches!(e, BindError::Mismatch { .. }), "{m}");
        assert!(
            m.contains("file /a (nvwc label 01010101-") && m.contains("file /other (no nvwc label"),
            "{m}"
        );
        assert!(
            m.contains("--force-attach") && m.contains("nvwc format --force --cache c.img"),
            "{m}"
        );
        // Another store's label.
        assert!(run(Cache::Existing(&s), &file("/b", Some((Y, 7)), 4096), false).is_err());
        // Forced: the unlabelled store gets a new uuid, a labelled one keeps its own.
        let p = run(Cache::Existing(&s), &other, true).unwrap();
        assert_eq!((p.label, p.id.uuid), (Some((NEW, C)), NEW));
        assert!(matches!(p.reason, Reason::Forced { .. }));
        let p = run(Cache::Existing(&s), &file("/b", Some((Y, 7)), 4096), true).unwrap();
        assert_eq!((p.label, p.id.uuid), (Some((Y, C)), Y));
        // The same file, moved: its label says so.
        let p = run(
            Cache::Existing(&s),
            &file("/moved", Some((X, C)), 4096),
            false,
        )
        .unwrap();
        assert_eq!(p.reason, Reason::Moved { from: "/a".into() });
        assert!(p.id.location.is("/moved"));
    }

    #[test]
    fn a_store_bound_to_another_cache_since_makes_this_one_stale() {
        let a = file("/a", Some((X, C)), 4096);
        let s = sb(Some(a.id.clone()));
        let now = file("/a", Some((X, 77)), 4096);
        let e = run(Cache::Existing(&s), &now, false).unwrap_err();
        assert!(matches!(e, BindError::Stale { other: 77, .. }), "{e}");
        let p = run(Cache::Existing(&s), &now, true).unwrap();
        assert_eq!(p.label, Some((X, C)));
        // Released (no cache): bound again.
        let p = run(Cache::Existing(&s), &file("/a", Some((X, 0)), 4096), false).unwrap();
        assert_eq!((p.label, p.reason), (Some((X, C)), Reason::Reclaimed));
    }

    #[test]
    fn old_caches_are_adopted_unless_the_store_is_taken() {
        let s = sb(None);
        let p = run(Cache::Existing(&s), &file("/a", None, 4096), false).unwrap();
        assert_eq!((p.label, p.reason), (Some((NEW, C)), Reason::Adopted));
        let e = run(Cache::Existing(&s), &file("/a", Some((X, 5)), 4096), false).unwrap_err();
        assert!(matches!(e, BindError::Stale { other: 5, .. }));
        assert!(run(Cache::Existing(&s), &file("/a", Some((X, 5)), 4096), true).is_ok());
    }

    #[test]
    fn upstreams_without_a_label_compare_uri_name_and_size() {
        let a = nbd("nbd+unix:///?socket=/a.sock", None, false);
        let s = sb(Some(a.id.clone()));
        assert_eq!(
            run(Cache::Existing(&s), &a, false).unwrap().reason,
            Reason::Same
        );
        let b = nbd("nbd+unix:///?socket=/b.sock", None, false);
        assert!(matches!(
            run(Cache::Existing(&s), &b, false),
            Err(BindError::Mismatch { .. })
        ));
        let mut named = a.clone();
        named.name = "disk2".into();
        assert!(run(Cache::Existing(&s), &named, false).is_err());
        let mut bigger = a.clone();
        bigger.id.size += 4096;
        assert!(run(Cache::Existing(&s), &bigger, false).is_err());
        // The same upstream, now journaled: it gets a label.
        let p = run(
            Cache::Existing(&s),
            &nbd("nbd+unix:///?socket=/a.sock", None, true),
            false,
        )
        .unwrap();
        assert_eq!((p.label, p.reason), (Some((NEW, C)), Reason::Labelled));
        // Labelled, reached by another URI: the label decides.
        let la = nbd("nbd+unix:///?socket=/a.sock", Some((X, C)), true);
        let s = sb(Some(la.id.clone()));
        let p = run(
            Cache::Existing(&s),
            &nbd("nbd://host/", Some((X, C)), true),
            false,
        )
        .unwrap();
        assert!(matches!(p.reason, Reason::Moved { .. }));
        // Labelled when bound, the label gone now (another server at the
        // same socket): refused.
        assert!(run(
            Cache::Existing(&s),
            &nbd("nbd+unix:///?socket=/a.sock", None, false),
            false
        )
        .is_err());
    }

    #[test]
    fn block_devices_match_by_any_of_their_names() {
        let dev = |names: &[&str]| Given {
            id: BackingId::new(BackingKind::Block, [0; 16], 1 << 30, names[0], ""),
            location: names[0].into(),
            name: String::new(),
            label: None,
            can_label: false,
            aliases: names.iter().map(|s| s.to_string()).collect(),
        };
        let d = dev(&["/dev/disk/by-id/wwn-0x1", "/dev/sdb"]);
        let s = sb(Some(d.id.clone()));
        // Renumbered (sdb -> sdc), same disk.
        let p = run(
            Cache::Existing(&s),
            &dev(&["/dev/disk/by-id/wwn-0x1", "/dev/sdc"]),
            false,
        );
        assert_eq!(p.unwrap().reason, Reason::Same);
        // Another disk at the old name.
        assert!(run(
            Cache::Existing(&s),
            &dev(&["/dev/disk/by-id/wwn-0x2", "/dev/sdb"]),
            false
        )
        .is_err());
    }
}
