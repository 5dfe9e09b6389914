//! Checks on paths the user gives: what kind of file a path names, and opening a file for
//! reading without ever blocking on a FIFO or reading a device.

use std::fs::{File, FileType, Metadata};
use std::path::Path;

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

#[cfg(all(test, unix))]
mod tests {
    use super::*;

    #[test]
    fn kinds_are_named() {
        let dir = std::env::temp_dir();
        let e = open_regular(&dir, "the model").unwrap_err();
        assert!(e.to_string().contains("is a directory"), "{e}");
        let e = open_regular(Path::new("/dev/null"), "the model").unwrap_err();
        assert!(e.to_string().contains("character device"), "{e}");
    }
}
