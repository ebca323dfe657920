package driver

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpujob/gpujob/internal/taskevent"
)

func eventLine(t *testing.T, round int) string {
	t.Helper()
	b, err := json.Marshal(taskevent.Event{Kind: taskevent.Joined, Round: round, Time: time.Unix(1, 0).UTC()})
	if err != nil {
		t.Fatal(err)
	}
	return string(b) + "\n"
}

func rounds(t *testing.T, r *eventReader) []int {
	t.Helper()
	var out []int
	r.read(func(e taskevent.Event) { out = append(out, e.Round) })
	return out
}

// The reader takes whole lines only, keeps a partial one for the next
// read, and drops a line too long to be an event without losing the ones
// after it.
func TestEventReaderLinesAndLimits(t *testing.T) {
	path := filepath.Join(t.TempDir(), "train.events")
	r := &eventReader{path: path}
	if got := rounds(t, r); len(got) != 0 {
		t.Fatalf("no file yet: %v", got)
	}
	one := eventLine(t, 1)
	if err := os.WriteFile(path, []byte(one+one[:10]), 0o600); err != nil {
		t.Fatal(err)
	}
	if got := rounds(t, r); len(got) != 1 || got[0] != 1 {
		t.Fatalf("first read: %v, want [1]", got)
	}
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	huge := strings.Repeat("x", 3*maxEventsChunk)
	if _, err := f.WriteString(one[10:] + huge + "\n" + eventLine(t, 3)); err != nil {
		t.Fatal(err)
	}
	if got := rounds(t, r); len(got) != 2 || got[0] != 1 || got[1] != 3 {
		t.Fatalf("second read: %v, want [1 3] (the split line, then the one after the over-long line)", got)
	}
	if len(r.partial) != 0 || cap(r.partial) > 2*maxEventsChunk {
		t.Errorf("reader holds %d bytes (capacity %d) after whole lines", len(r.partial), cap(r.partial))
	}
}

// A container's root may replace its events file: the root driver must
// not follow a symbolic link to another file of the host, nor block on a
// FIFO.
func TestEventReaderRefusesLinksAndFIFOs(t *testing.T) {
	dir := t.TempDir()
	secret := filepath.Join(dir, "host-file")
	if err := os.WriteFile(secret, []byte(eventLine(t, 7)), 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link.events")
	if err := os.Symlink(secret, link); err != nil {
		t.Fatal(err)
	}
	if got := rounds(t, &eventReader{path: link}); len(got) != 0 {
		t.Errorf("read %v through a symbolic link", got)
	}
	// Below the trusted directory no component may be a link: a
	// directory of the allocation swapped for one leads nowhere.
	shared := filepath.Join(dir, "alloc")
	if err := os.Mkdir(shared, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(dir, filepath.Join(shared, "gpujob")); err != nil {
		t.Fatal(err)
	}
	via := filepath.Join(shared, "gpujob", "host-file")
	if got := rounds(t, &eventReader{path: via, trusted: shared}); len(got) != 0 {
		t.Errorf("read %v through a linked directory below the trusted one", got)
	}
	if got := rounds(t, &eventReader{path: via}); len(got) != 1 {
		t.Errorf("without a trusted directory the same path reads %v, want [7] (the test's own check)", got)
	}
	real := filepath.Join(shared, "events")
	if err := os.Mkdir(real, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(real, "train.events"), []byte(eventLine(t, 5)), 0o600); err != nil {
		t.Fatal(err)
	}
	if got := rounds(t, &eventReader{path: filepath.Join(real, "train.events"), trusted: shared}); len(got) != 1 || got[0] != 5 {
		t.Errorf("a plain path below the trusted directory reads %v, want [5]", got)
	}
	// A directory or file that is not root's alone below the trusted
	// directory is what a rank could have put there: refused.
	if os.Geteuid() == 0 {
		forged := filepath.Join(shared, "forged")
		if err := os.Mkdir(forged, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(forged, "train.events"), []byte(eventLine(t, 9)), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(forged, 65534, 65534); err != nil {
			t.Fatal(err)
		}
		if got := rounds(t, &eventReader{path: filepath.Join(forged, "train.events"), trusted: shared}); len(got) != 0 {
			t.Errorf("read %v from a directory of another user's", got)
		}
		if err := os.Chown(forged, 0, 0); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(filepath.Join(forged, "train.events"), 65534, 65534); err != nil {
			t.Fatal(err)
		}
		if got := rounds(t, &eventReader{path: filepath.Join(forged, "train.events"), trusted: shared}); len(got) != 0 {
			t.Errorf("read %v from a file of another user's", got)
		}
	}
	fifo := filepath.Join(dir, "fifo.events")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	done := make(chan []int, 1)
	go func() { done <- rounds(t, &eventReader{path: fifo}) }()
	select {
	case got := <-done:
		if len(got) != 0 {
			t.Errorf("read %v from a FIFO", got)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("reading a FIFO with no writer blocked")
	}
}
