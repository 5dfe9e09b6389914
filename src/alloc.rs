//! Fallible host allocation for buffers whose size comes from a file or the command line.
//!
//! `Vec::with_capacity` and `vec![x; n]` abort the process when the allocator says no (for example
//! under a memory limit); these return `Error::Alloc` naming what was being allocated instead.

use std::collections::HashMap;
use std::hash::Hash;

use crate::error::{Error, Result};

fn alloc_error<T>(n: usize, what: &str) -> Error {
    Error::Alloc {
        what: what.to_owned(),
        bytes: (n as u128).saturating_mul(std::mem::size_of::<T>() as u128),
    }
}

/// An empty vector with room for `n` elements.
pub fn vec_with_capacity<T>(n: usize, what: &str) -> Result<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|_| alloc_error::<T>(n, what))?;
    Ok(v)
}

/// `n` copies of `value`.
pub fn vec_filled<T: Clone>(n: usize, value: T, what: &str) -> Result<Vec<T>> {
    let mut v = vec_with_capacity(n, what)?;
    v.resize(n, value);
    Ok(v)
}

/// Room for `n` more elements in `v`.
pub fn reserve<T>(v: &mut Vec<T>, n: usize, what: &str) -> Result<()> {
    v.try_reserve(n).map_err(|_| alloc_error::<T>(n, what))
}

/// An empty map with room for `n` entries.
pub fn map_with_capacity<K: Eq + Hash, V>(n: usize, what: &str) -> Result<HashMap<K, V>> {
    let mut m = HashMap::new();
    m.try_reserve(n).map_err(|_| alloc_error::<(K, V)>(n, what))?;
    Ok(m)
}

/// An owned copy of `s`.
pub fn string(s: &str, what: &str) -> Result<String> {
    let mut out = String::new();
    out.try_reserve_exact(s.len())
        .map_err(|_| alloc_error::<u8>(s.len(), what))?;
    out.push_str(s);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn impossible_sizes_are_errors_not_aborts() {
        let e = vec_with_capacity::<u64>(usize::MAX / 4, "test buffer").unwrap_err();
        assert!(matches!(&e, Error::Alloc { what, .. } if what == "test buffer"), "{e}");
        assert!(e.to_string().contains("test buffer"), "{e}");
        assert!(map_with_capacity::<u64, u64>(usize::MAX / 4, "map").is_err());
        let mut v = vec![1u8];
        assert!(reserve(&mut v, usize::MAX, "grow").is_err());
        assert_eq!(vec_filled(3, 7u16, "small").unwrap(), [7, 7, 7]);
    }
}
