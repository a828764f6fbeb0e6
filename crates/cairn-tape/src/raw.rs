//! Raw blocks between a tape and a byte stream, without Cairn's layout:
//! what `cairn tape dd` does, to fill an emulated tape from a file or
//! check what a drive holds. A stream is cut into blocks of the device's
//! size, the last one padded with zeros; reading back gives whole blocks
//! up to the first filemark or the end of data.

use crate::device::{ReadOutcome, TapeDevice};
use std::io::{self, Read, Write};

/// Blocks moved per device call: large enough that a real drive streams.
const BLOCKS_PER_CALL: usize = 32;

/// Rewinds `dev` and writes all of `input` as blocks from position 0 (the
/// last block padded with zeros), then a filemark, and makes it durable.
/// Returns the bytes read from `input` (before padding).
pub fn write_stream<D: TapeDevice + ?Sized>(dev: &mut D, mut input: impl Read) -> io::Result<u64> {
    let bs = dev.block_size();
    dev.rewind().map_err(io::Error::other)?;
    let mut buf = vec![0u8; bs * BLOCKS_PER_CALL];
    let mut total = 0u64;
    loop {
        // Fill the buffer whole unless the input ends: a short read of a
        // pipe must not become a padded block in the middle of the data.
        let mut n = 0;
        while n < buf.len() {
            match input.read(&mut buf[n..]) {
                Ok(0) => break,
                Ok(k) => n += k,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
        if n == 0 {
            break;
        }
        let padded = n.div_ceil(bs) * bs;
        buf[n..padded].fill(0);
        dev.write_blocks(&buf[..padded]).map_err(io::Error::other)?;
        total += n as u64;
        if n < buf.len() {
            break;
        }
    }
    dev.write_filemarks(1).map_err(io::Error::other)?;
    dev.flush().map_err(io::Error::other)?;
    Ok(total)
}

/// Rewinds `dev` and copies its blocks to `out` up to the first filemark
/// or the end of data. Returns the bytes written (whole blocks).
pub fn read_stream<D: TapeDevice + ?Sized>(dev: &mut D, mut out: impl Write) -> io::Result<u64> {
    let bs = dev.block_size();
    dev.rewind().map_err(io::Error::other)?;
    let mut buf = vec![0u8; bs * BLOCKS_PER_CALL];
    let mut total = 0u64;
    while let ReadOutcome::Blocks(n) = dev.read_blocks(&mut buf).map_err(io::Error::other)? {
        out.write_all(&buf[..n * bs])?;
        total += (n * bs) as u64;
    }
    out.flush()?;
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Clock, EmuDrive, EmuParams};

    /// Bytes in, the same bytes out, padded to a whole block; a stream
    /// that arrives in small pieces (a pipe) is not padded in the middle.
    #[test]
    fn a_stream_written_reads_back_padded_to_a_block() {
        let dir = tempfile::tempdir().unwrap();
        let params = EmuParams { block_size: 4096, ..Default::default() };
        let mut dev = EmuDrive::create(&dir.path().join("t"), params, Clock::virtual_clock()).unwrap();
        let data: Vec<u8> = (0..(4096 * BLOCKS_PER_CALL * 2 + 1000)).map(|i| (i * 7 % 251) as u8).collect();
        // A reader that hands out at most 777 bytes a call.
        struct Trickle<'a>(&'a [u8]);
        impl Read for Trickle<'_> {
            fn read(&mut self, b: &mut [u8]) -> io::Result<usize> {
                let n = self.0.len().min(b.len()).min(777);
                b[..n].copy_from_slice(&self.0[..n]);
                self.0 = &self.0[n..];
                Ok(n)
            }
        }
        assert_eq!(write_stream(&mut dev, Trickle(&data)).unwrap(), data.len() as u64);
        let mut out = Vec::new();
        let n = read_stream(&mut dev, &mut out).unwrap();
        assert_eq!(n, data.len().div_ceil(4096) as u64 * 4096);
        assert!(out[..data.len()] == data[..], "the bytes read back differ");
        assert!(out[data.len()..].iter().all(|b| *b == 0), "the padding is not zeros");
    }

    /// An empty stream writes no block; reading it back gives nothing.
    #[test]
    fn an_empty_stream_reads_back_empty() {
        let dir = tempfile::tempdir().unwrap();
        let params = EmuParams { block_size: 4096, ..Default::default() };
        let mut dev = EmuDrive::create(&dir.path().join("t"), params, Clock::virtual_clock()).unwrap();
        assert_eq!(write_stream(&mut dev, &b""[..]).unwrap(), 0);
        assert_eq!(read_stream(&mut dev, Vec::new()).unwrap(), 0);
    }
}
