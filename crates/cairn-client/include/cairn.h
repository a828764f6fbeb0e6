/*
 * cairn.h: insert, delete and replace bytes in the middle of a file inside
 * a Cairn mount without rewriting the rest of it (rwrite/rpwrite, after
 * VarFS). Link with -lcairn (libcairn.so, built by `cargo build --release
 * -p cairn-client`).
 *
 * The calls reach the mount's daemon through an ioctl on the descriptor;
 * the daemon splices the file's extent list and re-chunks only the chunks
 * at the edges of the change, so the cost does not depend on the file size.
 */
#ifndef CAIRN_H
#define CAIRN_H

#include <stddef.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Replaces the `mbyte` bytes at `offset` of the file open on `fd` (for
 * writing) with the `nbyte` bytes at `buf`: an insert when mbyte == 0, a
 * delete when nbyte == 0, an overwrite when they are equal. A range past the
 * end of the file is cut there; `offset` may equal the size but not pass it.
 *
 * Returns nbyte, or -1 with errno set:
 *   ENOTTY  fd is not a file inside a Cairn mount
 *   EBADF   fd is not open for writing
 *   EISDIR  fd is a directory
 *   EINVAL  offset is past the end of the file
 *   EROFS   the file is in a snapshot
 *   EFBIG   the result would be larger than the largest file size
 *           (2^63 - 1 bytes, as off_t allows)
 */
ssize_t cairn_rpwrite(int fd, const void *buf, size_t nbyte, off_t offset, size_t mbyte);

/* As cairn_rpwrite at the descriptor's file offset, which then advances by nbyte. */
ssize_t cairn_rwrite(int fd, const void *buf, size_t nbyte, size_t mbyte);

/*
 * Replaces the `mbyte` bytes at `offset` of fd's file with `len` bytes of
 * src_fd's file from `src_offset`, sharing their storage instead of copying.
 * Both files must be in the same Cairn mount (EXDEV otherwise), and src_fd
 * open for reading (EBADF otherwise), as for copy_file_range(2).
 * Returns 0, or -1 with errno set.
 */
int cairn_rpsplice(int fd, off_t offset, size_t mbyte, int src_fd, off_t src_offset, size_t len);

/* 1 if fd is a file inside a Cairn mount, else 0. */
int cairn_is_cairn(int fd);

/*
 * The ioctl protocol (version 2), for programs that cannot link libcairn.
 *
 * A splice names its source the way copy_file_range(2) does, by a
 * descriptor the program opened: CAIRN_IOC_SOURCE on that descriptor (open
 * for reading, else EBADF) returns a token naming its open file until the
 * file is closed; CAIRN_IOC_RPWRITE with CAIRN_RP_FROM_SOURCE on the target
 * takes it in `src`. An unknown or expired token is EBADF. Version 1's
 * inode numbers (flags 1) are refused with EINVAL.
 *
 * The kernel caches the file's pages and, with the writeback cache Cairn
 * mounts use, its own size. Before answering, the daemon drops the cached
 * pages and hands the kernel the file's new end, which also sets the new
 * size when the file grew (an insert), so fstat and an O_APPEND write see
 * it. A kernel keeps a size it cached when a delete shrank the file: after
 * an rpwrite whose new_size is below the old size, call
 * ftruncate(fd, new_size) as cairn_rpwrite does (it moves no data).
 */
#define CAIRN_IOC_PROBE   0x8010CA00u /* _IOR(0xCA, 0, struct cairn_probe) */
#define CAIRN_IOC_RPWRITE 0xFFD0CA01u /* _IOWR(0xCA, 1, struct cairn_rpwrite) */
#define CAIRN_IOC_SOURCE  0x8008CA02u /* _IOR(0xCA, 2, struct cairn_source) */
#define CAIRN_PROBE_MAGIC 0x3153464e52494143ull /* "CAIRNFS1" little-endian */
#define CAIRN_INLINE_MAX  (16 * 1024 - 128)
#define CAIRN_RP_FROM_SOURCE 2u

struct cairn_probe {
    unsigned long long magic;
    unsigned int version;
    unsigned int inline_max;
};

struct cairn_source {
    unsigned long long token;
};

struct cairn_rpwrite {
    unsigned long long offset, mbyte, nbyte, src /* token */, src_offset;
    unsigned int flags, pad;
    unsigned long long new_size, rechunked, new_bytes, old_chunks; /* out */
    unsigned char data[CAIRN_INLINE_MAX];
};

#ifdef __cplusplus
}
#endif
#endif
