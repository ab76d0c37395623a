// Command powerfs mounts a directory that loses what was not synced when told to, as a
// power cut would: a FUSE passthrough to a backing directory that keeps undo records of
// every change since the last fsync of each file and directory (layer.go), and applies them
// on "drop". rlog's tests mount it under replicas' data dirs to prove that an acknowledged
// entry survives a power cut (docs/faults.md, "Power loss").
//
//	powerfs -control SOCKET BACKING MOUNTPOINT
//
// The control socket (a unix stream socket) takes one command a line and answers one line:
//
//	drop     lose everything not synced (the processes using the mount must be dead first)
//	pending  what a drop would undo now: "ok files=F dirs=D"
//	ping     "ok"
//
// The socket exists once the mount is up. SIGTERM or SIGINT unmounts and exits (an unmount
// the kernel refuses, files still open, is made lazy).
//
// As root it mounts with mount(2) itself (go-fuse's DirectMount) and needs no fusermount;
// otherwise go-fuse falls back to fusermount3 (Debian's fuse3).
package main

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

func main() {
	control := flag.String("control", "", "the control socket's path (required)")
	realSync := flag.Bool("real-sync", false, "also fsync the backing files and directories "+
		"(off: the backing's durability is not what powerfs models)")
	debug := flag.Bool("debug", false, "log every FUSE request")
	flag.Usage = func() {
		fmt.Fprintf(os.Stderr, "usage: powerfs -control SOCKET [-real-sync] [-debug] BACKING MOUNTPOINT\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() != 2 || *control == "" {
		flag.Usage()
		os.Exit(2)
	}
	log.SetFlags(log.Ltime | log.Lmicroseconds)
	backing, mountpoint := flag.Arg(0), flag.Arg(1)
	l, err := newLayer(backing, *realSync)
	if err != nil {
		log.Fatalf("powerfs: backing %s: %v", backing, err)
	}
	rootFd, err := unix.Dup(l.rootFd)
	if err != nil {
		log.Fatalf("powerfs: %v", err)
	}
	root := &node{l: l, fd: rootFd, ino: l.rootIno}
	l.nodes[l.rootIno] = root
	zero := time.Duration(0)
	server, err := fs.Mount(mountpoint, root, &fs.Options{
		// No caching of names or attributes in the kernel: after a drop, what it would
		// remember may be gone.
		EntryTimeout: &zero,
		AttrTimeout:  &zero,
		MountOptions: fuse.MountOptions{
			FsName:      "powerfs:" + l.backing,
			Name:        "powerfs",
			DirectMount: true,
			AllowOther:  os.Geteuid() == 0,
			Debug:       *debug,
			MaxWrite:    1 << 20,
		},
	})
	if err != nil {
		log.Fatalf("powerfs: mount %s: %v", mountpoint, err)
	}
	os.Remove(*control)
	listener, err := net.Listen("unix", *control)
	if err != nil {
		server.Unmount()
		log.Fatalf("powerfs: control socket: %v", err)
	}
	go serve(listener, l)
	log.Printf("powerfs: %s mounted over %s (control %s)", mountpoint, l.backing, *control)

	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-signals
		listener.Close()
		unmount(server, mountpoint)
	}()
	server.Wait()
	os.Remove(*control)
}

func unmount(server *fuse.Server, mountpoint string) {
	for try := 0; try < 20; try++ {
		if err := server.Unmount(); err == nil {
			return
		} else if try == 19 {
			log.Printf("powerfs: unmount %s: %v; detaching it", mountpoint, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := unix.Unmount(mountpoint, unix.MNT_DETACH); err != nil {
		log.Printf("powerfs: lazy unmount %s: %v", mountpoint, err)
	}
	os.Exit(0)
}

func serve(listener net.Listener, l *layer) {
	for {
		conn, err := listener.Accept()
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				log.Printf("powerfs: control: %v", err)
			}
			return
		}
		go answer(conn, l)
	}
}

func answer(conn net.Conn, l *layer) {
	defer conn.Close()
	lines := bufio.NewScanner(conn)
	for lines.Scan() {
		var reply string
		switch cmd := strings.TrimSpace(lines.Text()); cmd {
		case "ping":
			reply = "ok"
		case "pending":
			l.mu.Lock()
			reply = fmt.Sprintf("ok files=%d dirs=%d", len(l.files), len(l.dirs))
			l.mu.Unlock()
		case "drop":
			l.mu.Lock()
			report, reverted, changed := l.drop()
			files := make([]*node, 0, len(reverted))
			for _, ino := range reverted {
				if n := l.nodes[ino]; n != nil {
					files = append(files, n)
				}
			}
			dirs := make([]*node, len(changed))
			for i, c := range changed {
				dirs[i] = l.nodes[c.dir]
			}
			l.mu.Unlock()
			// The kernel forgets what it cached of them (outside the lock: the kernel may
			// call back in while it invalidates).
			for _, n := range files {
				n.NotifyContent(0, 0)
			}
			for i, c := range changed {
				if dirs[i] != nil {
					dirs[i].NotifyEntry(c.name)
				}
			}
			log.Printf("powerfs: dropped %s", report)
			reply = "ok " + report
		default:
			reply = fmt.Sprintf("error: unknown command %q (drop, pending, ping)", cmd)
		}
		if _, err := fmt.Fprintln(conn, reply); err != nil {
			return
		}
	}
}
