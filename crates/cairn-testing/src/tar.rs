//! Raw tar blocks for crafting hostile archives, byte by byte, where
//! `cairn_tar::write_header` would refuse (or fix up) what a test needs.

/// One ustar header block: `name` (at most 100 bytes), mode 0644, uid and
/// gid 0, `size` in octal, a fixed mtime, `typeflag`, and a valid checksum.
pub fn ustar_header(name: &[u8], typeflag: u8, size: u64) -> [u8; 512] {
    assert!(name.len() <= 100, "a ustar name field holds 100 bytes");
    let mut b = [0u8; 512];
    b[..name.len()].copy_from_slice(name);
    b[100..108].copy_from_slice(b"0000644\0");
    b[108..116].copy_from_slice(b"0000000\0");
    b[116..124].copy_from_slice(b"0000000\0");
    b[124..136].copy_from_slice(format!("{size:011o}\0").as_bytes());
    b[136..148].copy_from_slice(b"14000000000\0");
    b[156] = typeflag;
    b[257..263].copy_from_slice(b"ustar\0");
    b[263..265].copy_from_slice(b"00");
    b[148..156].fill(b' ');
    let sum: u32 = b.iter().map(|&c| u32::from(c)).sum();
    b[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
    b
}
