//! Output files named on the command line. The target is checked before any work starts: a
//! device, FIFO, socket or directory is refused (never replaced by a regular file), a symbolic
//! link is followed and its target written, a dangling link is refused. The data goes to a
//! temporary file beside the target, which then replaces it in one rename, so a failed write
//! leaves the old file intact; the new file gets the old one's permissions. Every error names
//! the path the user gave, not the temporary file.

use std::fs::{File, OpenOptions, Permissions};
use std::io::{BufWriter, ErrorKind, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use crate::error::{Error, Result};
use crate::fsutil::file_kind;

/// A checked output path.
#[derive(Debug)]
pub struct Target {
    /// As the user wrote it (for messages).
    user: PathBuf,
    /// The file that will be replaced or created (the user's path with links resolved).
    real: PathBuf,
    /// Permissions of the file being replaced.
    perms: Option<Permissions>,
}

fn refuse(path: &Path, problem: String) -> Error {
    Error::BadPath {
        path: path.to_path_buf(),
        problem,
    }
}

/// Check that `path` may be written: a new file, or an existing regular file (directly or
/// through symbolic links) that we may write.
pub fn check_target(path: &Path) -> Result<Target> {
    let lmeta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == ErrorKind::NotFound => {
            return Ok(Target {
                user: path.to_path_buf(),
                real: path.to_path_buf(),
                perms: None,
            })
        }
        Err(e) => return Err(Error::io(path, e)),
    };
    let real = if lmeta.file_type().is_symlink() {
        match std::fs::canonicalize(path) {
            Ok(p) => p,
            Err(e) if e.kind() == ErrorKind::NotFound => {
                let to = std::fs::read_link(path).map_err(|e| Error::io(path, e))?;
                return Err(refuse(
                    path,
                    format!(
                        "is a symbolic link to '{}', which does not exist; create the file or \
                         give its path",
                        to.display()
                    ),
                ));
            }
            Err(e) => return Err(Error::io(path, e)),
        }
    } else {
        path.to_path_buf()
    };
    let meta = std::fs::metadata(&real).map_err(|e| Error::io(path, e))?;
    if !meta.is_file() {
        let through = if real != path { " (through a symbolic link)" } else { "" };
        return Err(refuse(
            path,
            format!(
                "is {}{through}; the output must be a regular file or a new path",
                file_kind(meta.file_type())
            ),
        ));
    }
    // Replacing goes through the directory, which would let a read-only file be overwritten;
    // refuse what a plain write would refuse. Opening without truncating changes nothing.
    OpenOptions::new()
        .write(true)
        .open(&real)
        .map_err(|e| Error::io(path, e))?;
    Ok(Target {
        user: path.to_path_buf(),
        real,
        perms: Some(meta.permissions()),
    })
}

impl Target {
    /// The path as the user gave it.
    pub fn path(&self) -> &Path {
        &self.user
    }

    /// Write the file with `fill` and put it in place.
    pub fn write(&self, fill: impl FnOnce(&mut dyn Write) -> std::io::Result<()>) -> Result<()> {
        let (tmp_path, file) = self.create_temp()?;
        let result = self.fill_and_replace(&tmp_path, file, fill);
        if result.is_err() {
            // Best effort: the temporary file is ours and useless now.
            let _ = std::fs::remove_file(&tmp_path);
        }
        result
    }

    fn fill_and_replace(
        &self,
        tmp_path: &Path,
        file: File,
        fill: impl FnOnce(&mut dyn Write) -> std::io::Result<()>,
    ) -> Result<()> {
        let err = |e| Error::io(&self.user, e);
        let mut w = BufWriter::with_capacity(1 << 20, file);
        fill(&mut w).map_err(err)?;
        let file = w.into_inner().map_err(|e| err(e.into_error()))?;
        if let Some(p) = &self.perms {
            file.set_permissions(p.clone()).map_err(err)?;
        }
        file.sync_all().map_err(err)?;
        drop(file);
        std::fs::rename(tmp_path, &self.real).map_err(err)
    }

    /// A new file beside the target (same directory, so the rename cannot cross file systems),
    /// created exclusively so an existing file or link there is never followed.
    fn create_temp(&self) -> Result<(PathBuf, File)> {
        static SEQ: AtomicU32 = AtomicU32::new(0);
        let dir = match self.real.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let name = self.real.file_name().map(|n| n.to_string_lossy().into_owned());
        let name = name.unwrap_or_else(|| "output".to_owned());
        loop {
            let seq = SEQ.fetch_add(1, Ordering::Relaxed);
            let tmp = dir.join(format!(".{name}.rill-{}-{seq}.tmp", std::process::id()));
            match OpenOptions::new().write(true).create_new(true).open(&tmp) {
                Ok(f) => return Ok((tmp, f)),
                Err(e) if e.kind() == ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(Error::io(&self.user, e)),
            }
        }
    }
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("rill-output-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn write(path: &Path, text: &str) -> Result<()> {
        check_target(path)?.write(|w| w.write_all(text.as_bytes()))
    }

    #[test]
    fn new_and_existing_files() {
        let d = dir("files");
        let p = d.join("out.bin");
        write(&p, "one").unwrap();
        std::fs::set_permissions(&p, Permissions::from_mode(0o640)).unwrap();
        write(&p, "two").unwrap();
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "two");
        let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o640, "permissions of the replaced file are kept");
        // Nothing but the output is left in the directory.
        assert_eq!(std::fs::read_dir(&d).unwrap().count(), 1);
    }

    #[test]
    fn links_are_written_through_and_dangling_ones_refused() {
        let d = dir("links");
        let real = d.join("real.bin");
        std::fs::write(&real, "old").unwrap();
        let link = d.join("link.bin");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        write(&link, "new").unwrap();
        assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink());
        assert_eq!(std::fs::read_to_string(&real).unwrap(), "new");

        let dangling = d.join("dangling.bin");
        std::os::unix::fs::symlink(d.join("missing"), &dangling).unwrap();
        let e = write(&dangling, "x").unwrap_err();
        assert!(e.to_string().contains("does not exist"), "{e}");
    }

    #[test]
    fn special_files_are_refused() {
        let d = dir("special");
        let e = write(&d, "x").unwrap_err();
        assert!(e.to_string().contains("is a directory"), "{e}");
        let e = write(Path::new("/dev/null"), "x").unwrap_err();
        assert!(e.to_string().contains("character device"), "{e}");
        let link = d.join("null");
        std::os::unix::fs::symlink("/dev/null", &link).unwrap();
        let e = write(&link, "x").unwrap_err();
        assert!(e.to_string().contains("through a symbolic link"), "{e}");
        assert!(e.to_string().contains(&*link.to_string_lossy()), "{e}");
    }

    #[test]
    fn failed_write_keeps_the_old_file_and_names_the_users_path() {
        let d = dir("fail");
        let p = d.join("keep.bin");
        std::fs::write(&p, "old").unwrap();
        let e = check_target(&p)
            .unwrap()
            .write(|_| Err(std::io::Error::other("disk on fire")))
            .unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains(&*p.to_string_lossy()) && !msg.contains(".tmp"), "{msg}");
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "old");
        assert_eq!(std::fs::read_dir(&d).unwrap().count(), 1, "temporary file removed");
    }
}
