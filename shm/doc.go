// Package shm creates, publishes and memory-maps the shared table file used by
// the lock manager. It is the only package that talks to the mmap library.
//
// # Creation protocol: publish by link
//
// Open never creates the file at its final path directly. Instead a creator:
//
//  1. creates a temporary file with a random name in the same directory as the
//     final path (O_CREATE|O_EXCL, so it never shares it with anyone);
//  2. sets its permissions with fchmod to exactly the requested mode (the umask
//     does not apply to fchmod), truncates it to the requested size and maps it;
//  3. lets the caller's init function fill the mapping completely;
//  4. publishes it with link(tmp, path), which atomically creates the name
//     path for the already-initialised inode, or fails with EEXIST if path
//     already exists;
//  5. always removes the temporary name.
//
// If link fails with EEXIST another process won the race: the loser discards its
// temporary file and opens the winner's file instead, exactly as if the file had
// existed from the start (the existing file is then checked by the caller's
// validate function). If that file disappears again before it can be opened
// (someone deleted it), Open retries the whole sequence a bounded number of
// times.
//
// Why this is race-free:
//
//   - link(2) is atomic and never replaces an existing name, so among any number
//     of processes creating the same path at once exactly one link succeeds;
//     all the others observe EEXIST and open that one file. Everybody ends up
//     sharing the same inode.
//   - The name path only ever refers to an inode whose init has already
//     completed (init runs before link, on a file nobody else can reach), so no
//     process can ever open or map a half-initialised file at path. There is no
//     "being initialised" state to wait for, and no lock file.
//   - A creator that crashes before link leaves at most a stray temporary file
//     (named ".<base>.tmp<random>"); it never leaves a half-written file at path.
//
// Since the file is shared through the page cache, data written through a
// MAP_SHARED mapping is visible to every other process mapping the same file;
// no msync is needed for sharing (only for durability, which is not a goal).
//
// # Opening existing files
//
// A symlink at path is refused with ErrSymlink (checked with Lstat and, on Unix,
// by opening with O_NOFOLLOW); a directory, FIFO, device or other non-regular
// file is refused with ErrNotRegular; a file smaller than the caller's minimum
// size (and any empty file) is refused with ErrTooSmall before it is mapped, so
// reads of a truncated file cannot fault. Only then is the file mapped and
// handed to validate.
//
// # Alignment
//
// Mappings start on a page boundary, so a word at an offset that is a multiple
// of 8 is 8-byte aligned in memory, as required for 64-bit atomic operations
// even on 386 and 32-bit ARM. Uint32 and Uint64 enforce in-range, aligned
// offsets and return pointers for use with sync/atomic.
//
// # Platforms
//
// Linux, macOS, FreeBSD (and other Unix systems) and Windows. On Windows there
// is no O_NOFOLLOW, so symlink refusal relies on Lstat plus a check that the
// opened file is the one Lstat saw; and because an open file cannot be deleted
// there, the creator closes its temporary file before removing its name and
// then reopens path.
package shm
