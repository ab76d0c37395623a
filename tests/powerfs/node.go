package main

// The FUSE side: a passthrough to the backing directory in which every node holds an O_PATH
// descriptor of its backing inode (not a path), so that a drop may move names around in
// the backing without confusing the nodes the kernel holds. Every change first tells the
// layer (layer.go), under its lock, what it is about to overwrite.

import (
	"context"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

type node struct {
	fs.Inode
	l   *layer
	fd  int // O_PATH|O_NOFOLLOW on the backing inode
	ino uint64
}

var (
	_ fs.NodeLookuper    = (*node)(nil)
	_ fs.NodeGetattrer   = (*node)(nil)
	_ fs.NodeSetattrer   = (*node)(nil)
	_ fs.NodeOpener      = (*node)(nil)
	_ fs.NodeCreater     = (*node)(nil)
	_ fs.NodeMkdirer     = (*node)(nil)
	_ fs.NodeMknoder     = (*node)(nil)
	_ fs.NodeSymlinker   = (*node)(nil)
	_ fs.NodeLinker      = (*node)(nil)
	_ fs.NodeReadlinker  = (*node)(nil)
	_ fs.NodeUnlinker    = (*node)(nil)
	_ fs.NodeRmdirer     = (*node)(nil)
	_ fs.NodeRenamer     = (*node)(nil)
	_ fs.NodeReaddirer   = (*node)(nil)
	_ fs.NodeFsyncer     = (*node)(nil)
	_ fs.NodeStatfser    = (*node)(nil)
	_ fs.NodeOnForgetter = (*node)(nil)
)

func (n *node) isDir() bool { return n.StableAttr().Mode&syscall.S_IFMT == syscall.S_IFDIR }

// child is the node of the entry `name` of n (whose O_PATH descriptor `fd` is handed over).
func (n *node) child(ctx context.Context, fd int, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, errno(err)
	}
	out.Attr.FromStat(&st)
	c := &node{l: n.l, fd: fd, ino: st.Ino}
	inode := n.NewInode(ctx, c, fs.StableAttr{Mode: st.Mode & syscall.S_IFMT, Ino: st.Ino, Gen: 1})
	if inode.Operations() != fs.InodeEmbedder(c) {
		unix.Close(fd) // the kernel knows this inode already: its node keeps its own
	} else {
		n.l.mu.Lock()
		n.l.nodes[st.Ino] = c
		n.l.mu.Unlock()
	}
	return inode, 0
}

func (n *node) openPath(name string) (int, syscall.Errno) {
	fd, err := unix.Openat(n.fd, name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	return fd, errno(err)
}

func (n *node) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if n.ino == n.l.rootIno && name == stashName {
		return nil, syscall.ENOENT
	}
	fd, e := n.openPath(name)
	if e != 0 {
		return nil, e
	}
	return n.child(ctx, fd, out)
}

func (n *node) OnForget() {
	n.l.mu.Lock()
	if n.l.nodes[n.ino] == n {
		delete(n.l.nodes, n.ino)
	}
	n.l.mu.Unlock()
	unix.Close(n.fd)
}

func (n *node) Getattr(ctx context.Context, f fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	fd := n.fd
	if h, ok := f.(*handle); ok {
		fd = h.fd
	}
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		return errno(err)
	}
	out.FromStat(&st)
	return 0
}

func (n *node) Setattr(ctx context.Context, f fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if size, ok := in.GetSize(); ok {
		n.l.mu.Lock()
		err := n.l.truncating(n, int64(size))
		if err == nil {
			err = unix.Ftruncate(n.l.files[n.ino].fd, int64(size))
		}
		n.l.mu.Unlock()
		if err != nil {
			return errno(err)
		}
	}
	if mode, ok := in.GetMode(); ok {
		if err := unix.Chmod(procPath(n.fd), mode&07777); err != nil {
			return errno(err)
		}
	}
	uid, uok := in.GetUID()
	gid, gok := in.GetGID()
	if uok || gok {
		u, g := -1, -1
		if uok {
			u = int(uid)
		}
		if gok {
			g = int(gid)
		}
		flags := unix.AT_EMPTY_PATH | unix.AT_SYMLINK_NOFOLLOW
		if err := unix.Fchownat(n.fd, "", u, g, flags); err != nil {
			return errno(err)
		}
	}
	atime, aok := in.GetATime()
	mtime, mok := in.GetMTime()
	if aok || mok {
		ts := []unix.Timespec{{Nsec: unix.UTIME_OMIT}, {Nsec: unix.UTIME_OMIT}}
		if aok {
			ts[0] = unix.NsecToTimespec(atime.UnixNano())
		}
		if mok {
			ts[1] = unix.NsecToTimespec(mtime.UnixNano())
		}
		if err := unix.UtimesNanoAt(unix.AT_FDCWD, procPath(n.fd), ts, 0); err != nil {
			return errno(err)
		}
	}
	return n.Getattr(ctx, f, out)
}

// openFlags are the flags of the backing open: the kernel positions every write (so no
// O_APPEND), truncation goes through the layer, and durability is the layer's.
func openFlags(flags uint32) int {
	strip := unix.O_CREAT | unix.O_EXCL | unix.O_NOCTTY | unix.O_TRUNC | unix.O_APPEND |
		unix.O_DIRECT | unix.O_SYNC | unix.O_DSYNC
	return int(flags)&^strip | unix.O_CLOEXEC
}

func (n *node) newHandle(fd int, flags uint32) *handle {
	return &handle{n: n, fd: fd, sync: int(flags)&(unix.O_SYNC|unix.O_DSYNC) != 0}
}

// truncated empties a file opened with O_TRUNC.
func (n *node) truncated(flags uint32) syscall.Errno {
	if int(flags)&unix.O_TRUNC == 0 || int(flags)&unix.O_ACCMODE == unix.O_RDONLY {
		return 0
	}
	n.l.mu.Lock()
	defer n.l.mu.Unlock()
	err := n.l.truncating(n, 0)
	if err == nil {
		err = unix.Ftruncate(n.l.files[n.ino].fd, 0)
	}
	return errno(err)
}

func (n *node) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	fd, err := unix.Open(procPath(n.fd), openFlags(flags), 0)
	if err != nil {
		return nil, 0, errno(err)
	}
	if e := n.truncated(flags); e != 0 {
		unix.Close(fd)
		return nil, 0, e
	}
	return n.newHandle(fd, flags), 0, 0
}

func (n *node) Create(ctx context.Context, name string, flags uint32, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	n.l.mu.Lock()
	var st unix.Stat_t
	existed := unix.Fstatat(n.fd, name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil
	err := n.l.changing(n)
	var fd int
	if err == nil {
		fd, err = unix.Openat(n.fd, name, openFlags(flags)|unix.O_CREAT, mode)
	}
	n.l.mu.Unlock()
	if err != nil {
		return nil, nil, 0, errno(err)
	}
	pathFd, e := n.openPath(name)
	if e != 0 {
		unix.Close(fd)
		return nil, nil, 0, e
	}
	inode, e := n.child(ctx, pathFd, out)
	if e != 0 {
		unix.Close(fd)
		return nil, nil, 0, e
	}
	c := inode.Operations().(*node)
	if existed {
		if e := c.truncated(flags); e != 0 {
			unix.Close(fd)
			return nil, nil, 0, e
		}
	}
	return inode, c.newHandle(fd, flags), 0, 0
}

// created makes the node of a new entry made by `make` (under the layer's lock, after the
// directory's record began).
func (n *node) created(ctx context.Context, name string, out *fuse.EntryOut, make func() error) (*fs.Inode, syscall.Errno) {
	n.l.mu.Lock()
	err := n.l.changing(n)
	if err == nil {
		err = make()
	}
	n.l.mu.Unlock()
	if err != nil {
		return nil, errno(err)
	}
	fd, e := n.openPath(name)
	if e != 0 {
		return nil, e
	}
	return n.child(ctx, fd, out)
}

func (n *node) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	return n.created(ctx, name, out, func() error { return unix.Mkdirat(n.fd, name, mode) })
}

func (n *node) Mknod(ctx context.Context, name string, mode uint32, dev uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	return n.created(ctx, name, out, func() error { return unix.Mknodat(n.fd, name, mode, int(dev)) })
}

func (n *node) Symlink(ctx context.Context, target, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	return n.created(ctx, name, out, func() error { return unix.Symlinkat(target, n.fd, name) })
}

func (n *node) Link(ctx context.Context, target fs.InodeEmbedder, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	t := target.(*node)
	return n.created(ctx, name, out, func() error {
		return unix.Linkat(unix.AT_FDCWD, procPath(t.fd), n.fd, name, unix.AT_SYMLINK_FOLLOW)
	})
}

func (n *node) Readlink(ctx context.Context) ([]byte, syscall.Errno) {
	buf := make([]byte, 4096)
	k, err := unix.Readlinkat(n.fd, "", buf)
	if err != nil {
		return nil, errno(err)
	}
	return buf[:k], 0
}

func (n *node) Unlink(ctx context.Context, name string) syscall.Errno {
	n.l.mu.Lock()
	defer n.l.mu.Unlock()
	if err := n.l.changing(n); err != nil {
		return errno(err)
	}
	n.l.stash(n, name)
	return errno(unix.Unlinkat(n.fd, name, 0))
}

func (n *node) Rmdir(ctx context.Context, name string) syscall.Errno {
	n.l.mu.Lock()
	defer n.l.mu.Unlock()
	if err := n.l.changing(n); err != nil {
		return errno(err)
	}
	return errno(n.l.removeDir(n, name))
}

func (n *node) Rename(ctx context.Context, name string, newParent fs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	p := newParent.(*node)
	n.l.mu.Lock()
	defer n.l.mu.Unlock()
	if err := n.l.changing(n); err != nil {
		return errno(err)
	}
	if err := n.l.changing(p); err != nil {
		return errno(err)
	}
	if flags&unix.RENAME_EXCHANGE == 0 {
		var src, dst unix.Stat_t
		if err := unix.Fstatat(n.fd, name, &src, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return errno(err)
		}
		if unix.Fstatat(p.fd, newName, &dst, unix.AT_SYMLINK_NOFOLLOW) == nil && src.Ino != dst.Ino {
			if flags&unix.RENAME_NOREPLACE != 0 {
				return syscall.EEXIST
			}
			srcDir := src.Mode&unix.S_IFMT == unix.S_IFDIR
			dstDir := dst.Mode&unix.S_IFMT == unix.S_IFDIR
			switch {
			case srcDir && dstDir:
				// The empty directory replaced keeps its inode in the stash.
				if err := n.l.removeDir(p, newName); err != nil {
					return errno(err)
				}
			case srcDir:
				return syscall.ENOTDIR
			case dstDir:
				return syscall.EISDIR
			default:
				n.l.stash(p, newName)
			}
		}
	}
	return errno(unix.Renameat2(n.fd, name, p.fd, newName, uint(flags)))
}

func (n *node) Readdir(ctx context.Context) (fs.DirStream, syscall.Errno) {
	entries, err := n.l.listAt(n.fd, n.ino)
	if err != nil {
		return nil, errno(err)
	}
	list := make([]fuse.DirEntry, 0, len(entries))
	for _, name := range sortedNames(entries) {
		e := entries[name]
		list = append(list, fuse.DirEntry{Name: name, Mode: e.mode, Ino: e.ino})
	}
	return fs.NewListDirStream(list), 0
}

// Fsync is fsync and fdatasync, of a file or of a directory (FUSE_FSYNCDIR comes here too).
func (n *node) Fsync(ctx context.Context, f fs.FileHandle, flags uint32) syscall.Errno {
	n.l.mu.Lock()
	defer n.l.mu.Unlock()
	if n.isDir() {
		return errno(n.l.syncDir(n))
	}
	return errno(n.l.syncFile(n))
}

// Statfs reports the backing file system's space, as the processes' free-space checks need.
func (n *node) Statfs(ctx context.Context, out *fuse.StatfsOut) syscall.Errno {
	var st syscall.Statfs_t
	if err := syscall.Fstatfs(n.l.rootFd, &st); err != nil {
		return errno(err)
	}
	out.FromStatfsT(&st)
	return 0
}

// handle is an open file: a descriptor of the backing file.
type handle struct {
	n    *node
	fd   int
	sync bool // opened O_SYNC or O_DSYNC: every write is synced
}

var (
	_ fs.FileReader    = (*handle)(nil)
	_ fs.FileWriter    = (*handle)(nil)
	_ fs.FileReleaser  = (*handle)(nil)
	_ fs.FileFlusher   = (*handle)(nil)
	_ fs.FileLseeker   = (*handle)(nil)
	_ fs.FileAllocater = (*handle)(nil)
)

func (h *handle) Read(ctx context.Context, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	return fuse.ReadResultFd(uintptr(h.fd), off, len(dest)), 0
}

func (h *handle) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	l := h.n.l
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.overwriting(h.n, off, off+int64(len(data))); err != nil {
		return 0, errno(err)
	}
	written := 0
	for written < len(data) {
		k, err := unix.Pwrite(h.fd, data[written:], off+int64(written))
		if err != nil {
			return uint32(written), errno(err)
		}
		written += k
	}
	if h.sync {
		if err := l.syncFile(h.n); err != nil {
			return uint32(written), errno(err)
		}
	}
	return uint32(written), 0
}

// Flush (each close) makes nothing durable: only fsync does.
func (h *handle) Flush(ctx context.Context) syscall.Errno { return 0 }

func (h *handle) Release(ctx context.Context) syscall.Errno {
	return errno(unix.Close(h.fd))
}

func (h *handle) Lseek(ctx context.Context, off uint64, whence uint32) (uint64, syscall.Errno) {
	at, err := unix.Seek(h.fd, int64(off), int(whence))
	return uint64(at), errno(err)
}

func (h *handle) Allocate(ctx context.Context, off uint64, size uint64, mode uint32) syscall.Errno {
	l := h.n.l
	l.mu.Lock()
	defer l.mu.Unlock()
	pf, err := l.pending(h.n.ino, h.n.fd)
	if err != nil {
		return errno(err)
	}
	// Modes that zero bytes (punch a hole, zero a range) overwrite what is there.
	if mode&(unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_ZERO_RANGE) != 0 {
		if err := pf.save(int64(off), int64(off+size)); err != nil {
			return errno(err)
		}
	}
	return errno(unix.Fallocate(h.fd, mode, int64(off), int64(size)))
}
