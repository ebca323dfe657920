package nvml

import (
	"errors"
	"regexp"
	"testing"
	"time"
)

var uuidRE = regexp.MustCompile(`^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)

func TestFakeUUIDs(t *testing.T) {
	a := NewFake(FakeSpec{Count: 4, Model: "m", MemoryMiB: 1, Seed: "node-a"}).Devices()
	again := NewFake(FakeSpec{Count: 4, Model: "m", MemoryMiB: 1, Seed: "node-a"}).Devices()
	b := NewFake(FakeSpec{Count: 4, Model: "m", MemoryMiB: 1, Seed: "node-b"}).Devices()
	seen := map[string]bool{}
	for i := range a {
		if !uuidRE.MatchString(a[i].UUIDValue) {
			t.Errorf("UUID %q is not GPU-8-4-4-4-12 hex", a[i].UUIDValue)
		}
		if a[i].UUIDValue != again[i].UUIDValue {
			t.Errorf("device %d: UUID not stable for one seed: %s vs %s", i, a[i].UUIDValue, again[i].UUIDValue)
		}
		seen[a[i].UUIDValue], seen[b[i].UUIDValue] = true, true
	}
	if len(seen) != 8 {
		t.Errorf("%d distinct UUIDs over 2 seeds × 4 devices, want 8", len(seen))
	}
}

func TestFakeLibrary(t *testing.T) {
	lib := NewFake(FakeSpec{Count: 2, Model: "m", MemoryMiB: 1})
	if err := lib.Init(); err != nil {
		t.Fatalf("Init: %v", err)
	}
	if n, _ := lib.DeviceCount(); n != 2 {
		t.Errorf("DeviceCount = %d, want 2", n)
	}
	for _, i := range []int{-1, 2} {
		if _, err := lib.DeviceByIndex(i); err == nil {
			t.Errorf("DeviceByIndex(%d) succeeded", i)
		}
	}
	lib.SetInitError(ErrLibraryNotFound)
	if err := lib.Init(); !errors.Is(err, ErrLibraryNotFound) {
		t.Errorf("Init = %v, want ErrLibraryNotFound", err)
	}
	lib.SetDevices(lib.Devices()[:1])
	if n, _ := lib.DeviceCount(); n != 1 {
		t.Errorf("DeviceCount after SetDevices = %d, want 1", n)
	}
}

func TestFakeEvents(t *testing.T) {
	lib := NewFake(FakeSpec{Count: 1, Model: "m", MemoryMiB: 1})
	set, err := lib.NewEventSet()
	if err != nil {
		t.Fatal(err)
	}
	defer set.Free()
	if _, err := set.Wait(time.Millisecond); !errors.Is(err, ErrTimeout) {
		t.Errorf("Wait with nothing injected = %v, want ErrTimeout", err)
	}
	want := Event{UUID: "GPU-x", Type: EventXidCritical, Data: 79}
	lib.Inject(want)
	if got, err := set.Wait(time.Second); err != nil || got != want {
		t.Errorf("Wait = %v, %v; want %v", got, err, want)
	}
}

func TestFakeDeviceErrors(t *testing.T) {
	d := NewFakeDevice(FakeSpec{Model: "m", MemoryMiB: 1}, 0)
	d.NVLinks[2] = "peer"
	if _, err := d.NVLinkRemoteBusID(1); !errors.Is(err, ErrNotSupported) {
		t.Errorf("inactive link: %v, want ErrNotSupported", err)
	}
	if p, err := d.NVLinkRemoteBusID(2); err != nil || p != "peer" {
		t.Errorf("active link: %q, %v", p, err)
	}
	if on, err := d.MIGEnabled(); err != nil || on {
		t.Errorf("MIGEnabled = %v, %v on a GPU without MIG", on, err)
	}
	d.Update(func(d *FakeDevice) { d.Unsupported["Temperature"] = true })
	if _, err := d.Temperature(); !errors.Is(err, ErrNotSupported) {
		t.Errorf("Temperature = %v, want ErrNotSupported", err)
	}
	d.Update(func(d *FakeDevice) { d.Lost = true })
	if _, err := d.UUID(); !errors.Is(err, ErrGPULost) {
		t.Errorf("UUID of a lost GPU = %v, want ErrGPULost", err)
	}
}
