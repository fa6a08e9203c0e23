//! The two files an ingest writes: the data file (what the store keeps, `data_len` bytes from the start) and
//! the tail file (every other byte of the parts, numbered on from `data_len` by the layout). Keeping the tail
//! apart means the data file never changes length once made, so no step of finishing a store leaves it at a
//! length a resume would not recognise.

use super::{StoreFile, StoreLayout};

pub struct IngestFiles<F> {
    pub data: F,
    pub tail: F,
    /// Where the tail's numbering starts (`StoreLayout::data_len`).
    pub data_len: u64,
}

impl<F: StoreFile> IngestFiles<F> {
    /// The file and the offset in it of a store offset.
    fn place(&self, store_offset: u64) -> (&F, u64) {
        if store_offset < self.data_len {
            (&self.data, store_offset)
        } else {
            (&self.tail, store_offset - self.data_len)
        }
    }

    /// Writes bytes [start, start + bytes.len()) of `part` where the layout puts them.
    pub async fn write_part_range(&self, layout: &StoreLayout, part: usize, start: u64, bytes: &[u8]) -> Result<(), String> {
        for p in layout.pieces_in(part, start, bytes.len() as u64) {
            // pieces never straddle data_len: the data region's end is a piece boundary
            let (file, at) = self.place(p.store_offset);
            let from = (p.file_offset - start) as usize;
            file.write_at(at, &bytes[from..from + p.len as usize]).await?;
        }
        Ok(())
    }

    /// Reads bytes [start, start + len) of `part` back from where the layout put them.
    pub async fn read_part_range(&self, layout: &StoreLayout, part: usize, start: u64, len: u64) -> Result<Vec<u8>, String> {
        let mut out = vec![0u8; len as usize];
        for p in layout.pieces_in(part, start, len) {
            let (file, at) = self.place(p.store_offset);
            let from = (p.file_offset - start) as usize;
            file.read_at(at, &mut out[from..from + p.len as usize]).await?;
        }
        Ok(out)
    }

    pub async fn flush(&self) -> Result<(), String> {
        self.data.flush().await?;
        self.tail.flush().await
    }
}
