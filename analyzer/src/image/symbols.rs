//! An image's symbol table, built on first use.
//!
//! Loading an image used to build the symbol table of every file it found
//! (the binary's, its debug file's) and merge them: names copied one by
//! one and sorted, about 15 % of a short deep-stack analysis (libc's debug
//! file alone has some 10,000 function symbols). Most of those tables are
//! never read: an image whose addresses the trace's frame table resolves,
//! or one no sample lands in, needs no symbol table. A [`Symbols`] keeps
//! the files to read and the tables to merge, in order, and builds the
//! table the first time it is asked for, exactly as the eager merge did.

use super::FileBytes;
use lrnprof_image::{merge_symbols, object_has_symbols, symbols_of_object, Symbol};
use std::sync::{Arc, OnceLock};

/// What a symbol table is built from, in merge order.
enum Part {
    /// The symbols of an ELF or Mach-O file
    /// ([`symbols_of_object`]).
    File(Arc<FileBytes>),
    /// A table built already.
    Table(Vec<Symbol>),
}

/// A symbol table (sorted by SVMA, as [`symbols_of_object`] gives one),
/// built from its parts on first use.
#[derive(Default)]
pub(crate) struct Symbols {
    /// Merged in order with [`merge_symbols`] into the table.
    parts: Vec<Part>,
    table: OnceLock<Vec<Symbol>>,
}

impl Symbols {
    /// The symbols of the file in `bytes`, read when first asked for.
    pub fn of_file(bytes: Arc<FileBytes>) -> Symbols {
        Symbols {
            parts: vec![Part::File(bytes)],
            table: OnceLock::new(),
        }
    }

    /// A table built already.
    pub fn of_table(table: Vec<Symbol>) -> Symbols {
        Symbols {
            parts: Vec::new(),
            table: OnceLock::from(table),
        }
    }

    /// The table, built now if it was not.
    pub fn table(&self) -> &[Symbol] {
        self.table.get_or_init(|| {
            let mut table = Vec::new();
            for part in &self.parts {
                let symbols = match part {
                    Part::File(bytes) => object::File::parse(&bytes[..])
                        .map(|obj| symbols_of_object(&obj))
                        .unwrap_or_default(),
                    Part::Table(t) => t.clone(),
                };
                merge_symbols(&mut table, symbols);
            }
            table
        })
    }

    /// Whether the table is empty, found without building it: merging
    /// gives an empty table only from empty ones.
    pub fn is_empty(&self) -> bool {
        if let Some(table) = self.table.get() {
            return table.is_empty();
        }
        self.parts.iter().all(|part| match part {
            Part::File(bytes) => {
                !object::File::parse(&bytes[..]).is_ok_and(|obj| object_has_symbols(&obj))
            }
            Part::Table(t) => t.is_empty(),
        })
    }

    /// Add `from`'s symbols as [`merge_symbols`] would, when the table is
    /// built.
    pub fn merge(&mut self, from: Symbols) {
        let mut parts = std::mem::take(self).take_parts();
        parts.extend(from.take_parts());
        *self = Symbols {
            parts,
            table: OnceLock::new(),
        };
    }

    /// The parts, or the table if it is built.
    fn take_parts(mut self) -> Vec<Part> {
        match self.table.take() {
            Some(table) => vec![Part::Table(table)],
            None => self.parts,
        }
    }
}

impl std::fmt::Debug for Symbols {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.table.get() {
            Some(t) => write!(f, "Symbols({} built)", t.len()),
            None => write!(f, "Symbols({} parts to build)", self.parts.len()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn this_binary() -> Arc<FileBytes> {
        let bytes = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        Arc::new(FileBytes::Shared(Arc::new(bytes)))
    }

    /// Built late, a table is what merging eagerly gave, whether parts
    /// come before or after an earlier build.
    #[test]
    fn the_table_built_late_is_the_eager_merge() {
        let file = this_binary();
        let obj = object::File::parse(&file[..]).unwrap();
        let own = symbols_of_object(&obj);
        assert!(!own.is_empty());
        let extra = vec![
            Symbol::new(1, 4, "before_everything"),
            Symbol::new(own[0].svma, 1, "a"),
        ];
        let mut eager = own.clone();
        merge_symbols(&mut eager, extra.clone());

        let mut lazy = Symbols::of_file(file.clone());
        lazy.merge(Symbols::of_table(extra.clone()));
        assert!(lazy.table.get().is_none(), "nothing built by merging");
        assert!(!lazy.is_empty());
        assert!(
            lazy.table.get().is_none(),
            "nothing built to say it is not empty"
        );
        assert_eq!(lazy.table(), &eager[..]);

        // Built, then merged with more.
        let mut built = Symbols::of_file(file);
        assert_eq!(built.table(), &own[..]);
        built.merge(Symbols::of_table(extra));
        assert_eq!(built.table(), &eager[..]);
    }

    #[test]
    fn empty_parts_give_an_empty_table() {
        let mut s = Symbols::default();
        assert!(s.is_empty());
        s.merge(Symbols::of_table(Vec::new()));
        assert!(s.is_empty());
        assert!(s.table().is_empty());
        s.merge(Symbols::of_table(vec![Symbol::new(16, 4, "f")]));
        assert!(!s.is_empty());
        assert_eq!(s.table().len(), 1);
        // Bytes that are not an image have no symbols.
        let garbage = Symbols::of_file(Arc::new(FileBytes::Shared(Arc::new(b"nope".to_vec()))));
        assert!(garbage.is_empty());
        assert!(garbage.table().is_empty());
    }
}
