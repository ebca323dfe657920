package driver

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/gpujob/gpujob/driver/supervisor"
	"github.com/gpujob/gpujob/internal/taskevent"
)

// followEvents calls emit for every event the supervisor appends to path,
// from offset on, until ctx ends; then it reads what is left once more, so
// the supervisor's last word (why it failed) is never lost. It waits on
// inotify, not on a timer: the driver wakes when the file changes.
//
// opened, when set, is called once, the first time the file is there to
// read (a container member's supervisor creates it once it has read its
// spec).
func followEvents(ctx context.Context, path, trusted string, offset int64, opened func(), emit func(taskevent.Event)) error {
	in, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return fmt.Errorf("inotify: %w", err)
	}
	// Non-blocking, so reads park in Go's poller and Close wakes them.
	notify := os.NewFile(uintptr(in), "inotify")
	defer notify.Close()
	// Watch the directory: the file may not exist yet.
	if _, err := unix.InotifyAddWatch(in, filepath.Dir(path), unix.IN_MODIFY|unix.IN_CREATE|unix.IN_MOVED_TO|unix.IN_DONT_FOLLOW); err != nil {
		return fmt.Errorf("watching %s: %w", filepath.Dir(path), err)
	}
	go func() {
		<-ctx.Done()
		notify.Close()
	}()

	r := &eventReader{path: path, trusted: trusted, offset: offset, opened: opened}
	r.read(emit)
	buf := make([]byte, 4096)
	for {
		if _, err := notify.Read(buf); err != nil {
			if errors.Is(err, os.ErrClosed) || ctx.Err() != nil {
				r.read(emit)
				return nil
			}
			return fmt.Errorf("reading inotify: %w", err)
		}
		r.read(emit)
	}
}

// eventReader reads whole event lines past offset.
//
// The file is the supervisor's, and a container member's supervisor writes
// it in the allocation's shared directory, where whatever runs as root in
// the container may put anything in its place; the driver reading it is
// root on the host. So it opens only a regular file, never through a
// symbolic link (which could point at any file of the host) and never a
// FIFO or device (whose open or read could block the relay forever), and
// it holds at most maxEventsChunk of it at a time, dropping a line longer
// than maxEventLine (no event is near that), however much is written. Below
// a trusted directory it also wants root's own directories, writable by
// root alone, and a file of root's with one link: the ranks, which run as
// another user, can move the shared directory's entries around (Nomad makes
// it world-writable) but cannot make such files.
type eventReader struct {
	path string
	// trusted, when set, is a directory above path that the task cannot
	// replace (the allocation's shared directory, a mount point in the
	// container): the components below it are opened one by one without
	// following a link, so a directory swapped for a link leads nowhere.
	trusted string
	offset  int64
	// opened is called once, when the file is first opened.
	opened  func()
	partial []byte
	// skipping is set while the rest of an over-long line is dropped.
	skipping bool
}

const (
	maxEventsChunk = 256 << 10
	maxEventLine   = 64 << 10
)

func (r *eventReader) read(emit func(taskevent.Event)) {
	f, err := openNoFollow(r.trusted, r.path)
	if err != nil {
		return
	}
	defer f.Close()
	if r.opened != nil {
		r.opened()
		r.opened = nil
	}
	if _, err := f.Seek(r.offset, io.SeekStart); err != nil {
		return
	}
	buf := make([]byte, maxEventsChunk)
	for {
		n, err := f.Read(buf)
		if n > 0 {
			r.offset += int64(n)
			r.consume(buf[:n], emit)
		}
		if err != nil || n == 0 {
			return
		}
	}
}

// openNoFollow opens the regular file at path for reading, without
// following a symbolic link in its last component or, below trusted, in any
// component, and without opening anything else (a FIFO would block, a
// device may act on open): the last component is looked at through an
// O_PATH descriptor first. Below trusted, every directory must be root's
// and writable by root alone, and the file root's with one link.
func openNoFollow(trusted, path string) (*os.File, error) {
	rel, err := filepath.Rel(trusted, path)
	below := trusted != "" && err == nil && rel != "." && !strings.HasPrefix(rel, "..")
	dir, name := filepath.Dir(path), filepath.Base(path)
	var dirfd int
	if below {
		if dirfd, err = unix.Open(trusted, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0); err != nil {
			return nil, err
		}
		parts := strings.Split(rel, string(filepath.Separator))
		for _, part := range parts[:len(parts)-1] {
			next, err := unix.Openat(dirfd, part, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
			unix.Close(dirfd)
			if err != nil {
				return nil, err
			}
			dirfd = next
			var st unix.Stat_t
			if err := unix.Fstat(dirfd, &st); err != nil || st.Uid != 0 || st.Mode&0o022 != 0 {
				unix.Close(dirfd)
				return nil, fmt.Errorf("%s: not a directory of root's that only root can write", part)
			}
		}
	} else if dirfd, err = unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0); err != nil {
		return nil, err
	}
	pathfd, err := unix.Openat(dirfd, name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	unix.Close(dirfd)
	if err != nil {
		return nil, err
	}
	defer unix.Close(pathfd)
	var st unix.Stat_t
	if err := unix.Fstat(pathfd, &st); err != nil {
		return nil, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, fmt.Errorf("%s is not a regular file", path)
	}
	if below && (st.Uid != 0 || st.Nlink != 1) {
		return nil, fmt.Errorf("%s is not root's own file", path)
	}
	// Reopen what was looked at, not the name again.
	fd, err := unix.Open(fmt.Sprintf("/proc/self/fd/%d", pathfd), unix.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(fd), path), nil
}

// consume adds b to the pending partial line and emits every whole event.
func (r *eventReader) consume(b []byte, emit func(taskevent.Event)) {
	for len(b) > 0 {
		if r.skipping {
			i := bytes.IndexByte(b, '\n')
			if i < 0 {
				return
			}
			b, r.skipping = b[i+1:], false
			continue
		}
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			if len(r.partial)+len(b) > maxEventLine {
				r.partial, r.skipping = r.partial[:0], true
				return
			}
			r.partial = append(r.partial, b...)
			return
		}
		line := append(r.partial, b[:i+1]...)
		b = b[i+1:]
		if len(line) <= maxEventLine+1 {
			events, _ := supervisor.ReadEvents(line)
			for _, e := range events {
				emit(e)
			}
		}
		r.partial = line[:0]
	}
}

// fileSize is the size of path, 0 when it does not exist.
func fileSize(path string) int64 {
	fi, err := os.Lstat(path)
	if err != nil {
		return 0
	}
	return fi.Size()
}
