//! `cairn insert|delete|replace|clone`: edits inside a mount that move
//! or share chunks instead of copying bytes.

use crate::{edit, logging, size};
use anyhow::Result;
use std::path::PathBuf;

/// Insert bytes into FILE at OFFSET, moving the rest of the file along
/// (no rewrite: only the chunks at the edges are re-chunked).
///
/// FILE must be inside a Cairn mount and writable by you. The bytes come
/// from --from SRC (shared, not copied, when SRC is in the same mount)
/// or standard input.
#[derive(clap::Args)]
pub struct InsertArgs {
    pub file: PathBuf,
    #[arg(value_parser = size::parse)]
    pub offset: u64,
    /// Where the new bytes come from ('-' for standard input).
    #[arg(long, value_name = "SRC")]
    pub from: Option<PathBuf>,
}

pub fn insert(a: InsertArgs, verbose: u8) -> Result<i32> {
    let InsertArgs { file, offset, from } = a;
    logging::init(verbose, None)?;
    edit::replace(&file, offset, 0, Some(edit::Source::from_arg(from)?))?;
    Ok(0)
}

/// Delete LEN bytes of FILE at OFFSET, moving the rest of the file back.
#[derive(clap::Args)]
pub struct DeleteArgs {
    pub file: PathBuf,
    #[arg(value_parser = size::parse)]
    pub offset: u64,
    #[arg(value_parser = size::parse)]
    pub len: u64,
}

pub fn delete(a: DeleteArgs, verbose: u8) -> Result<i32> {
    let DeleteArgs { file, offset, len } = a;
    logging::init(verbose, None)?;
    edit::replace(&file, offset, len, None)?;
    Ok(0)
}

/// Replace LEN bytes of FILE at OFFSET with new bytes of any length.
#[derive(clap::Args)]
pub struct ReplaceArgs {
    pub file: PathBuf,
    #[arg(value_parser = size::parse)]
    pub offset: u64,
    #[arg(value_parser = size::parse)]
    pub len: u64,
    /// Where the new bytes come from ('-' for standard input).
    #[arg(long, value_name = "SRC")]
    pub from: Option<PathBuf>,
}

pub fn replace(a: ReplaceArgs, verbose: u8) -> Result<i32> {
    let ReplaceArgs { file, offset, len, from } = a;
    logging::init(verbose, None)?;
    edit::replace(&file, offset, len, Some(edit::Source::from_arg(from)?))?;
    Ok(0)
}

/// Copy a file or a whole tree inside a mounted volume without copying
/// data: the copy shares the source's chunks until either is changed.
///
/// Modes, owners, times, xattrs, symlinks and hard links inside the tree
/// are kept. DST must not exist. (Plain `cp` of a file inside a Cairn
/// mount is a clone too: it uses copy_file_range.)
#[derive(clap::Args)]
pub struct CloneArgs {
    pub src: PathBuf,
    pub dst: PathBuf,
}

pub fn clone(a: CloneArgs, verbose: u8) -> Result<i32> {
    let CloneArgs { src, dst } = a;
    logging::init(verbose, None)?;
    edit::clone(&src, &dst)?;
    Ok(0)
}
