// Command slowfs mounts a directory on a slower disk than the one it is on: a FUSE
// passthrough (go-fuse's loopback) to a backing directory whose file syncs take longer, as
// on a disk with a slower cache flush. rlog's benchmark kit runs etcd and rlog on it to
// learn their ratios on a slow disk as well as on whatever disk the host has
// (docs/performance.md, "A slow disk on purpose").
//
//	slowfs [-sync-latency 2ms] [-queue 1] BACKING MOUNTPOINT
//
// The model is one device that flushes -queue requests at a time (0: any number): an
// fsync or fdatasync of a file takes a slot, holds it for -sync-latency and then syncs the
// backing file; syncs beyond -queue wait for a slot, as on a disk that flushes one request
// at a time (-queue 1, the default) or a network block device that takes several at once. Reads and writes are not
// slowed: on a kernel with FUSE passthrough (6.9+) they go straight to the backing file
// without reaching this process, which is also why slowfs cannot model a write rate (it
// never sees the bytes). Syncs of directories pass through undelayed.
//
// SIGTERM or SIGINT unmounts and exits. As root it mounts with mount(2) itself (go-fuse's
// DirectMount); otherwise go-fuse falls back to fusermount3 (Debian's fuse3).
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// device is the slow disk every file of the mount shares.
type device struct {
	slots   chan struct{} // one per sync the device takes at once; nil: no limit
	latency time.Duration
}

// sync holds a slot of the device for -sync-latency, then for `real` (the backing file's
// own sync).
func (d *device) sync(real func() syscall.Errno) syscall.Errno {
	if d.slots != nil {
		d.slots <- struct{}{}
		defer func() { <-d.slots }()
	}
	time.Sleep(d.latency)
	return real()
}

// node is a loopback node whose syncs go through the device.
type node struct {
	*fs.LoopbackNode
	disk *device
}

var (
	_ fs.NodeWrapChilder = (*node)(nil)
	_ fs.NodeFsyncer     = (*node)(nil)
)

func (n *node) WrapChild(ctx context.Context, ops fs.InodeEmbedder) fs.InodeEmbedder {
	return &node{LoopbackNode: ops.(*fs.LoopbackNode), disk: n.disk}
}

func (n *node) Fsync(ctx context.Context, f fs.FileHandle, flags uint32) syscall.Errno {
	s, ok := f.(fs.FileFsyncer)
	if !ok {
		return syscall.ENOTSUP
	}
	return n.disk.sync(func() syscall.Errno { return s.Fsync(ctx, flags) })
}

func main() {
	latency := flag.Duration("sync-latency", 2*time.Millisecond, "what every file sync takes on top")
	queue := flag.Int("queue", 1, "syncs the device takes at once (0: any number)")
	flag.Usage = func() {
		fmt.Fprintf(os.Stderr, "usage: slowfs [-sync-latency D] [-queue N] BACKING MOUNTPOINT\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() != 2 || *latency < 0 || *queue < 0 {
		flag.Usage()
		os.Exit(2)
	}
	log.SetFlags(log.Ltime | log.Lmicroseconds)
	backing, mountpoint := flag.Arg(0), flag.Arg(1)
	var st syscall.Stat_t
	if err := syscall.Stat(backing, &st); err != nil {
		log.Fatalf("slowfs: backing %s: %v", backing, err)
	}
	root := &node{
		LoopbackNode: &fs.LoopbackNode{RootData: &fs.LoopbackRoot{Path: backing, Dev: uint64(st.Dev)}},
		disk:         &device{latency: *latency},
	}
	if *queue > 0 {
		root.disk.slots = make(chan struct{}, *queue)
	}
	root.RootData.RootNode = root
	second := time.Second
	server, err := fs.Mount(mountpoint, root, &fs.Options{
		EntryTimeout: &second,
		AttrTimeout:  &second,
		MountOptions: fuse.MountOptions{
			FsName:      "slowfs:" + backing,
			Name:        "slowfs",
			DirectMount: true,
			AllowOther:  os.Geteuid() == 0,
			MaxWrite:    1 << 20,
		},
	})
	if err != nil {
		log.Fatalf("slowfs: mount %s: %v", mountpoint, err)
	}
	log.Printf("slowfs: %s mounted over %s (syncs +%v, %d at a time)", mountpoint, backing,
		*latency, *queue)

	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-signals
		for try := 0; try < 20; try++ {
			if server.Unmount() == nil {
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
		if err := unix.Unmount(mountpoint, unix.MNT_DETACH); err != nil {
			log.Printf("slowfs: lazy unmount %s: %v", mountpoint, err)
		}
		os.Exit(0)
	}()
	server.Wait()
}
