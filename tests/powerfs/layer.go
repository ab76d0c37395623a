package main

// What a power cut would lose, kept apart so that it can be lost.
//
// The backing directory always holds what the processes on the mount see (reads and writes
// pass through to it). Beside it, the layer keeps what the backing held at the last fsync of
// each file and each directory that changed since, as an undo record:
//
//   - a file's data: its size at its last fsync (fsync or fdatasync) and the synced bytes that
//     writes, truncates and hole punches have overwritten since (read from the backing file
//     just before they are overwritten; bytes written past the synced size need no record);
//   - a directory's entries: name -> inode as of its last fsync, taken when the first create,
//     mknod, mkdir, symlink, link, unlink, rmdir or rename in it since then happens. An inode a
//     recorded entry may need again (a file unlinked or renamed over, a directory removed) is
//     kept alive under the stash directory, named by its inode number, until no record names
//     it.
//
// A drop (the power cut) applies the undo records: every file's synced bytes are written
// back and its size set to the synced size; every changed directory gets exactly its
// recorded entries back (names created since leave, names removed or renamed away come
// back, a rename is undone). So after a drop the backing holds what a disk that honours
// fsync and nothing more would hold after a power cut: unsynced data may be lost even after
// close, a file created and fdatasync'ed whose directory was never fsynced vanishes, a
// rename not followed by an fsync of its directory is undone.
//
// The model is the strict POSIX one, harsher than ext4 or XFS in ordered mode: there, a
// file's fsync usually commits its new directory entry too, and a rename over a file
// usually persists with it. Software that is correct on powerfs is correct on any of them.

import (
	"fmt"
	"log"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// stashName is the hidden directory under the backing root that keeps inodes alive for the
// undo records; the mount never shows it.
const stashName = ".powerfs-stash"

type entry struct {
	ino  uint64
	mode uint32 // the S_IFMT bits
}

type extent struct {
	off  int64
	data []byte
}

// pendingFile is the undo record of one file's data since its last fsync.
type pendingFile struct {
	fd     int      // read-write on the backing file, open while the record exists
	synced int64    // its size at its last fsync
	saved  []extent // synced bytes overwritten since, by offset, disjoint, all below synced
}

// save records the synced bytes of [from, to) that no extent holds yet: the bytes the
// backing file holds there now, since nothing overwrote them since the fsync.
func (pf *pendingFile) save(from, to int64) error {
	to = min(to, pf.synced)
	if from >= to {
		return nil
	}
	var added []extent
	at := from
	for _, e := range pf.saved {
		end := e.off + int64(len(e.data))
		if end <= at {
			continue
		}
		if e.off >= to {
			break
		}
		if e.off > at {
			gap, err := readAt(pf.fd, at, e.off)
			if err != nil {
				return err
			}
			added = append(added, gap)
		}
		at = end
		if at >= to {
			break
		}
	}
	if at < to {
		gap, err := readAt(pf.fd, at, to)
		if err != nil {
			return err
		}
		added = append(added, gap)
	}
	pf.saved = append(pf.saved, added...)
	sort.Slice(pf.saved, func(i, j int) bool { return pf.saved[i].off < pf.saved[j].off })
	return nil
}

// revert puts the file back as it was at its last fsync.
func (pf *pendingFile) revert() error {
	for _, e := range pf.saved {
		for done := 0; done < len(e.data); {
			n, err := unix.Pwrite(pf.fd, e.data[done:], e.off+int64(done))
			if err != nil {
				return err
			}
			done += n
		}
	}
	return unix.Ftruncate(pf.fd, pf.synced)
}

func readAt(fd int, from, to int64) (extent, error) {
	buf := make([]byte, to-from)
	for done := 0; done < len(buf); {
		n, err := unix.Pread(fd, buf[done:], from+int64(done))
		if err != nil {
			return extent{}, err
		}
		if n == 0 {
			break // shorter than its synced size (cannot happen): the rest reads as zeros
		}
		done += n
	}
	return extent{from, buf}, nil
}

type layer struct {
	mu       sync.Mutex
	backing  string
	rootFd   int // O_PATH on the backing root
	rootIno  uint64
	stashFd  int // O_PATH on the stash
	realSync bool
	files    map[uint64]*pendingFile     // by backing inode number
	dirs     map[uint64]map[string]entry // a changed directory's entries at its last fsync
	nodes    map[uint64]*node            // the nodes the kernel knows, for invalidations
	drops    int
}

func newLayer(backing string, realSync bool) (*layer, error) {
	backing, err := filepath.Abs(backing)
	if err != nil {
		return nil, err
	}
	stash := filepath.Join(backing, stashName)
	// What a previous mount left there is nobody's any more: everything in the backing is
	// durable as the mount starts.
	if err := os.RemoveAll(stash); err != nil {
		return nil, err
	}
	if err := os.Mkdir(stash, 0o700); err != nil {
		return nil, err
	}
	l := &layer{
		backing:  backing,
		realSync: realSync,
		files:    map[uint64]*pendingFile{},
		dirs:     map[uint64]map[string]entry{},
		nodes:    map[uint64]*node{},
	}
	if l.rootFd, err = unix.Open(backing, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0); err != nil {
		return nil, err
	}
	if l.stashFd, err = unix.Open(stash, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0); err != nil {
		return nil, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(l.rootFd, &st); err != nil {
		return nil, err
	}
	l.rootIno = st.Ino
	return l, nil
}

func procPath(fd int) string { return "/proc/self/fd/" + strconv.Itoa(fd) }

// pending is the undo record of the file `ino` (whose O_PATH descriptor is `fd`), begun if
// it had none: then the backing holds its synced state.
func (l *layer) pending(ino uint64, fd int) (*pendingFile, error) {
	if pf := l.files[ino]; pf != nil {
		return pf, nil
	}
	rw, err := unix.Open(procPath(fd), unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(rw, &st); err != nil {
		unix.Close(rw)
		return nil, err
	}
	pf := &pendingFile{fd: rw, synced: st.Size}
	l.files[ino] = pf
	return pf, nil
}

// overwriting records what [from, to) of a file holds, before it is overwritten.
func (l *layer) overwriting(n *node, from, to int64) error {
	pf, err := l.pending(n.ino, n.fd)
	if err != nil {
		return err
	}
	return pf.save(from, to)
}

// truncating records what a truncate to `size` takes away.
func (l *layer) truncating(n *node, size int64) error {
	pf, err := l.pending(n.ino, n.fd)
	if err != nil {
		return err
	}
	return pf.save(size, pf.synced)
}

func (l *layer) syncFile(n *node) error {
	pf := l.files[n.ino]
	if pf == nil {
		return nil
	}
	var err error
	if l.realSync {
		err = unix.Fdatasync(pf.fd)
	}
	unix.Close(pf.fd)
	delete(l.files, n.ino)
	return err
}

// listAt reads a directory's entries (by an O_PATH descriptor), the stash left out.
func (l *layer) listAt(dirFd int, ino uint64) (map[string]entry, error) {
	fd, err := unix.Openat(dirFd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), "dir")
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		return nil, err
	}
	out := make(map[string]entry, len(names))
	for _, name := range names {
		if ino == l.rootIno && name == stashName {
			continue
		}
		var st unix.Stat_t
		if err := unix.Fstatat(dirFd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			continue // gone meanwhile
		}
		out[name] = entry{st.Ino, st.Mode & unix.S_IFMT}
	}
	return out, nil
}

// changing begins the undo record of a directory about to change, if it had none.
func (l *layer) changing(dir *node) error {
	if _, ok := l.dirs[dir.ino]; ok {
		return nil
	}
	entries, err := l.listAt(dir.fd, dir.ino)
	if err != nil {
		return err
	}
	l.dirs[dir.ino] = entries
	return nil
}

// stash keeps the file about to leave `dir` under `name` reachable (a hard link in the
// stash), so that a drop can bring the name back.
func (l *layer) stash(dir *node, name string) {
	var st unix.Stat_t
	if unix.Fstatat(dir.fd, name, &st, unix.AT_SYMLINK_NOFOLLOW) != nil ||
		st.Mode&unix.S_IFMT == unix.S_IFDIR {
		return
	}
	err := unix.Linkat(dir.fd, name, l.stashFd, strconv.FormatUint(st.Ino, 10), 0)
	if err != nil && err != unix.EEXIST {
		log.Printf("powerfs: cannot stash %q: %v (a drop cannot bring it back)", name, err)
	}
}

// removeDir is rmdir, except that the (empty) directory moves into the stash, so that a
// drop can bring it back with its inode (and so its number is not reused meanwhile).
func (l *layer) removeDir(dir *node, name string) error {
	var st unix.Stat_t
	if err := unix.Fstatat(dir.fd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return unix.ENOTDIR
	}
	fd, err := unix.Openat(dir.fd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(fd), name)
	names, _ := f.Readdirnames(1)
	f.Close()
	if len(names) > 0 {
		return unix.ENOTEMPTY
	}
	return unix.Renameat(dir.fd, name, l.stashFd, strconv.FormatUint(st.Ino, 10))
}

// syncDir makes a directory's entries durable as they are, and lets go of the inodes no
// undo record needs any more.
func (l *layer) syncDir(dir *node) error {
	delete(l.dirs, dir.ino)
	l.collect()
	if l.realSync {
		fd, err := unix.Openat(dir.fd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		return unix.Fsync(fd)
	}
	return nil
}

// collect removes from the stash what no directory's record names (a stashed directory's
// own record goes with it), and the data records of files no name reaches.
func (l *layer) collect() {
	stash := filepath.Join(l.backing, stashName)
	for {
		named := map[uint64]bool{}
		for _, entries := range l.dirs {
			for _, e := range entries {
				named[e.ino] = true
			}
		}
		items, err := os.ReadDir(stash)
		if err != nil {
			log.Printf("powerfs: cannot read the stash: %v", err)
			return
		}
		again := false
		for _, item := range items {
			ino, err := strconv.ParseUint(item.Name(), 10, 64)
			if err != nil || named[ino] {
				continue
			}
			if err := os.RemoveAll(filepath.Join(stash, item.Name())); err != nil {
				log.Printf("powerfs: cannot clear the stash: %v", err)
			}
			if _, ok := l.dirs[ino]; ok {
				delete(l.dirs, ino)
				again = true // what its record named may be free now
			}
		}
		if !again {
			break
		}
	}
	for ino, pf := range l.files {
		var st unix.Stat_t
		if unix.Fstat(pf.fd, &st) == nil && st.Nlink == 0 {
			unix.Close(pf.fd)
			delete(l.files, ino)
		}
	}
}

// paths maps every inode under the backing root (the stash included) to one of its paths.
func (l *layer) paths() map[uint64]string {
	out := map[uint64]string{l.rootIno: l.backing}
	todo := []string{l.backing}
	for len(todo) > 0 {
		dir := todo[len(todo)-1]
		todo = todo[:len(todo)-1]
		items, err := os.ReadDir(dir)
		if err != nil {
			log.Printf("powerfs: cannot read %s: %v", dir, err)
			continue
		}
		for _, item := range items {
			path := filepath.Join(dir, item.Name())
			var st unix.Stat_t
			if unix.Lstat(path, &st) != nil {
				continue
			}
			if _, seen := out[st.Ino]; !seen {
				out[st.Ino] = path
			}
			if st.Mode&unix.S_IFMT == unix.S_IFDIR {
				todo = append(todo, path)
			}
		}
	}
	return out
}

// named is a directory entry a drop changed (for the kernel's caches).
type named struct {
	dir  uint64
	name string
}

// drop loses everything not synced, as a power cut would. The processes using the mount
// must be dead (a process that wrote on after the cut would not be a power cut). Returns
// what it undid, and the file inodes and directory entries it changed.
func (l *layer) drop() (string, []uint64, []named) {
	l.drops++
	var reverted []uint64
	for ino, pf := range l.files {
		if err := pf.revert(); err != nil {
			log.Printf("powerfs: cannot revert inode %d: %v", ino, err)
		}
		unix.Close(pf.fd)
		reverted = append(reverted, ino)
	}
	l.files = map[uint64]*pendingFile{}
	dirty := make([]uint64, 0, len(l.dirs))
	for ino := range l.dirs {
		dirty = append(dirty, ino)
	}
	sort.Slice(dirty, func(i, j int) bool { return dirty[i] < dirty[j] })
	var changed []named
	stash := filepath.Join(l.backing, stashName)
	// Every name not in its directory's record leaves for the stash (renamed there, or
	// unlinked when the stash holds the inode already)...
	for _, d := range dirty {
		where := l.paths()
		path, ok := where[d]
		if !ok {
			log.Printf("powerfs: directory inode %d is gone: its entries cannot come back", d)
			continue
		}
		var st unix.Stat_t
		if err := unix.Lstat(path, &st); err != nil {
			continue
		}
		fd, err := unix.Open(path, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			continue
		}
		live, err := l.listAt(fd, d)
		unix.Close(fd)
		if err != nil {
			log.Printf("powerfs: cannot list %s: %v", path, err)
			continue
		}
		for _, name := range sortedNames(live) {
			e := live[name]
			if was, ok := l.dirs[d][name]; ok && was.ino == e.ino {
				continue
			}
			from := filepath.Join(path, name)
			to := filepath.Join(stash, strconv.FormatUint(e.ino, 10))
			if _, err := os.Lstat(to); err == nil && e.mode != unix.S_IFDIR {
				err = os.Remove(from)
			} else {
				err = os.Rename(from, to)
			}
			if err != nil {
				log.Printf("powerfs: cannot take %s away: %v", from, err)
			}
			changed = append(changed, named{d, name})
		}
	}
	// ...then every recorded name missing comes back (a file linked from wherever its
	// inode is now, a directory moved).
	where := l.paths()
	for _, d := range dirty {
		for _, name := range sortedNames(l.dirs[d]) {
			e := l.dirs[d][name]
			path, ok := where[d]
			if !ok {
				continue
			}
			to := filepath.Join(path, name)
			if _, err := os.Lstat(to); err == nil {
				continue
			}
			from, ok := where[e.ino]
			if !ok {
				log.Printf("powerfs: inode %d of %s is gone: it cannot come back", e.ino, to)
				continue
			}
			var err error
			if e.mode == unix.S_IFDIR {
				err = os.Rename(from, to)
				where = l.paths()
			} else {
				err = os.Link(from, to)
			}
			if err != nil {
				log.Printf("powerfs: cannot bring %s back: %v", to, err)
			}
			changed = append(changed, named{d, name})
		}
	}
	names := len(l.dirs)
	l.dirs = map[uint64]map[string]entry{}
	items, _ := os.ReadDir(stash)
	for _, item := range items {
		if err := os.RemoveAll(filepath.Join(stash, item.Name())); err != nil {
			log.Printf("powerfs: cannot clear the stash: %v", err)
		}
	}
	report := fmt.Sprintf("files=%d dirs=%d entries=%d", len(reverted), names, len(changed))
	return report, reverted, changed
}

func sortedNames(entries map[string]entry) []string {
	names := make([]string, 0, len(entries))
	for name := range entries {
		names = append(names, name)
	}
	sort.Strings(names)
	return names
}

// errno maps an error of the syscalls above to the one the kernel gets.
func errno(err error) syscall.Errno {
	if err == nil {
		return 0
	}
	if e, ok := err.(syscall.Errno); ok {
		return e
	}
	if pe, ok := err.(*os.PathError); ok {
		return errno(pe.Err)
	}
	if le, ok := err.(*os.LinkError); ok {
		return errno(le.Err)
	}
	return syscall.EIO
}
