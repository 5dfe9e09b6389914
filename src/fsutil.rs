//! Checks on paths the user gives: what kind of file a path names, opening a file for reading
//! without ever blocking on a FIFO or reading a device, and replacing a file atomically.

use std::ffi::OsString;
use std::fs::{File, FileType, Metadata};
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// "a directory", "a FIFO (named pipe)", ... for error messages.
pub fn file_kind(ft: FileType) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if ft.is_fifo() {
            return "a FIFO (named pipe)";
        }
        if ft.is_char_device() {
            return "a character device";
        }
        if ft.is_block_device() {
            return "a block device";
        }
        if ft.is_socket() {
            return "a socket";
        }
    }
    if ft.is_dir() {
        "a directory"
    } else if ft.is_symlink() {
        "a symbolic link"
    } else if ft.is_file() {
        "a regular file"
    } else {
        "not a regular file"
    }
}

/// `Err` naming `path` and its kind unless `meta` describes a regular file.
pub fn require_regular(path: &Path, meta: &Metadata, role: &str) -> Result<()> {
    if meta.is_file() {
        return Ok(());
    }
    Err(Error::BadPath {
        path: path.to_path_buf(),
        problem: format!("is {}; {role} must be a regular file", file_kind(meta.file_type())),
    })
}

/// Open a regular file for reading. The type is checked before opening (so a device is never
/// opened) and again on the open file (the path may have changed in between); on Unix the open
/// itself is non-blocking, so a FIFO swapped in at that moment cannot hang it. `role` says what
/// the file is for ("the model") in errors.
pub fn open_regular(path: &Path, role: &str) -> Result<File> {
    let meta = std::fs::metadata(path).map_err(|e| Error::io(path, e))?;
    require_regular(path, &meta, role)?;
    let mut opts = std::fs::OpenOptions::new();
    opts.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        // Only affects FIFOs and devices, which are refused below; reads of a regular file
        // ignore it.
        opts.custom_flags(libc::O_NONBLOCK);
    }
    let file = opts.open(path).map_err(|e| Error::io(path, e))?;
    let meta = file.metadata().map_err(|e| Error::io(path, e))?;
    require_regular(path, &meta, role)?;
    Ok(file)
}

/// Write the file at `path` through `write`, all or nothing: the bytes go to a new temporary file
/// in the same directory, which is flushed to disk and then renamed over `path` (and the directory
/// flushed, so the rename survives a crash too). Whatever fails before the rename (`write`, a full
/// disk, an interrupted process) leaves the previous file as it was.
///
/// `path` must be absent or a regular file: a symbolic link (whose target would be replaced by
/// following it), a FIFO (whose open blocks), a device or a directory is refused. The temporary
/// file is created exclusively and never through a symbolic link. `role` says what the file is
/// for ("a state file") in errors.
pub fn write_atomically(path: &Path, role: &str, write: impl FnOnce(&mut File) -> Result<()>) -> Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(meta) => require_regular(path, &meta, role)?,
        Err(e) if e.kind() == ErrorKind::NotFound => {}
        Err(e) => return Err(Error::io(path, e)),
    }
    let (tmp_path, mut tmp) = create_temp_beside(path)?;
    let written = write(&mut tmp).and_then(|()| tmp.sync_all().map_err(|e| Error::io(&tmp_path, e)));
    drop(tmp);
    let result = written.and_then(|()| std::fs::rename(&tmp_path, path).map_err(|e| Error::io(path, e)));
    if let Err(e) = result {
        // Best effort: the error that matters is the one that stopped the write.
        let _ = std::fs::remove_file(&tmp_path);
        return Err(e);
    }
    sync_dir(path)
}

/// The directory `path` is in ("." for a bare file name).
fn parent_dir(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// A new, empty file next to `path` with a name no other writer uses: `.NAME.PID.N.tmp`, created
/// with `O_EXCL` (an existing file or symbolic link of that name is never opened; the next N is
/// tried) and `O_NOFOLLOW`.
fn create_temp_beside(path: &Path) -> Result<(PathBuf, File)> {
    let name = path.file_name().ok_or_else(|| Error::BadPath {
        path: path.to_path_buf(),
        problem: "names no file".into(),
    })?;
    let dir = parent_dir(path);
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.custom_flags(libc::O_NOFOLLOW);
    }
    const ATTEMPTS: u32 = 64;
    for n in 0..ATTEMPTS {
        let mut tmp_name = OsString::from(".");
        tmp_name.push(name);
        tmp_name.push(format!(".{}.{n}.tmp", std::process::id()));
        let tmp_path = dir.join(tmp_name);
        match opts.open(&tmp_path) {
            Ok(f) => return Ok((tmp_path, f)),
            Err(e) if e.kind() == ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(Error::io(&tmp_path, e)),
        }
    }
    Err(Error::BadPath {
        path: path.to_path_buf(),
        problem: format!("no free temporary file name beside it after {ATTEMPTS} tries"),
    })
}

/// Flush the directory holding `path`, making a rename into it durable (Unix; elsewhere the
/// rename is as durable as the platform makes it).
fn sync_dir(path: &Path) -> Result<()> {
    #[cfg(unix)]
    {
        let dir = parent_dir(path);
        File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| Error::io(dir, e))?;
    }
    #[cfg(not(unix))]
    let _ = path;
    Ok(())
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;
    use std::io::Write;

    /// A fresh directory per test (tests run in parallel).
    fn temp_dir(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("rill-fsutil-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        dir
    }

    fn entries(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .expect("read dir")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn atomic_write_replaces_the_file_and_leaves_nothing_else() {
        let dir = temp_dir("replace");
        let path = dir.join("state");
        write_atomically(&path, "a state file", |f| Ok(f.write_all(b"first")?)).expect("first");
        write_atomically(&path, "a state file", |f| Ok(f.write_all(b"second")?)).expect("second");
        assert_eq!(std::fs::read(&path).expect("read"), b"second");
        assert_eq!(entries(&dir), ["state"]);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A writer that fails half-way (a full disk, say) leaves the previous file whole.
    #[test]
    fn a_failed_write_keeps_the_previous_file() {
        let dir = temp_dir("fail");
        let path = dir.join("state");
        write_atomically(&path, "a state file", |f| Ok(f.write_all(b"the good state")?)).expect("first");
        let e = write_atomically(&path, "a state file", |f| {
            f.write_all(b"half of a new st")?;
            Err(Error::IoPlain(std::io::Error::new(ErrorKind::StorageFull, "disk full")))
        })
        .expect_err("the write fails");
        assert!(e.to_string().contains("disk full"), "{e}");
        assert_eq!(std::fs::read(&path).expect("read"), b"the good state");
        assert_eq!(entries(&dir), ["state"], "the temporary file is removed");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn special_targets_are_refused_untouched() {
        use std::os::unix::fs::FileTypeExt;
        let dir = temp_dir("special");
        let target = dir.join("target");
        std::fs::write(&target, b"precious").expect("target");
        let link = dir.join("link");
        std::os::unix::fs::symlink(&target, &link).expect("symlink");
        let fifo = dir.join("fifo");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).expect("c path");
        // SAFETY: `c` is a valid NUL-terminated path that outlives the call.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
        let sub = dir.join("sub");
        std::fs::create_dir(&sub).expect("subdir");
        let mut called = false;
        for (p, kind) in [
            (&link, "a symbolic link"),
            (&fifo, "a FIFO"),
            (&sub, "a directory"),
            (&PathBuf::from("/dev/null"), "a character device"),
        ] {
            let e = write_atomically(p, "a state file", |_| {
                called = true;
                Ok(())
            })
            .expect_err("refused");
            assert!(e.to_string().contains(kind), "{e}");
        }
        assert!(!called, "nothing is written for a refused target");
        assert_eq!(std::fs::read(&target).expect("read"), b"precious");
        assert!(std::fs::symlink_metadata(&link).expect("link").file_type().is_symlink());
        assert!(std::fs::metadata(&fifo).expect("fifo").file_type().is_fifo());
        assert_eq!(entries(&dir), ["fifo", "link", "sub", "target"]);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn kinds_are_named() {
        let dir = std::env::temp_dir();
        let e = open_regular(&dir, "the model").unwrap_err();
        assert!(e.to_string().contains("is a directory"), "{e}");
        let e = open_regular(Path::new("/dev/null"), "the model").unwrap_err();
        assert!(e.to_string().contains("character device"), "{e}");
    }
}
