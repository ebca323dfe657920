package driver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/gpujob/gpujob/driver/supervisor"
	"github.com/gpujob/gpujob/internal/taskevent"
)

// followEvents calls emit for every event the supervisor appends to path,
// from offset on, until ctx ends; then it reads what is left once more, so
// the supervisor's last word (why it failed) is never lost. It waits on
// inotify, not on a timer: the driver wakes when the file changes.
func followEvents(ctx context.Context, path string, offset int64, emit func(taskevent.Event)) error {
	in, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return fmt.Errorf("inotify: %w", err)
	}
	// Non-blocking, so reads park in Go's poller and Close wakes them.
	notify := os.NewFile(uintptr(in), "inotify")
	defer notify.Close()
	// Watch the directory: the file may not exist yet.
	if _, err := unix.InotifyAddWatch(in, filepath.Dir(path), unix.IN_MODIFY|unix.IN_CREATE|unix.IN_MOVED_TO); err != nil {
		return fmt.Errorf("watching %s: %w", filepath.Dir(path), err)
	}
	go func() {
		<-ctx.Done()
		notify.Close()
	}()

	r := &eventReader{path: path, offset: offset}
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
type eventReader struct {
	path    string
	offset  int64
	partial []byte
}

func (r *eventReader) read(emit func(taskevent.Event)) {
	f, err := os.Open(r.path)
	if err != nil {
		return
	}
	defer f.Close()
	if _, err := f.Seek(r.offset, io.SeekStart); err != nil {
		return
	}
	b, err := io.ReadAll(f)
	if err != nil || len(b) == 0 {
		return
	}
	r.offset += int64(len(b))
	r.partial = append(r.partial, b...)
	events, used := supervisor.ReadEvents(r.partial)
	r.partial = append(r.partial[:0], r.partial[used:]...)
	for _, e := range events {
		emit(e)
	}
}

// fileSize is the size of path, 0 when it does not exist.
func fileSize(path string) int64 {
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return fi.Size()
}
