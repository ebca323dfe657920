package gpu

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/nomad/plugins/device"

	"github.com/gpujob/gpujob/device/nvml"
)

// TestHealthEvents: NVML events make a GPU unhealthy at once (the period is
// an hour, so only the event can cause the new fingerprint), and only the GPU
// the event names.
func TestHealthEvents(t *testing.T) {
	cases := []struct {
		name    string
		health  *HealthConfig
		event   func(uuid string) nvml.Event
		want    string // HealthDesc substring; "" means the event is ignored
		ignored bool
	}{
		{"critical Xid 79", nil, xid(79), "Xid 79 (GPU has fallen off the bus)", false},
		{"critical Xid 48", nil, xid(48), "Xid 48", false},
		{"unknown Xid is critical", nil, xid(1234), "Xid 1234", false},
		{"double-bit ECC", nil, func(u string) nvml.Event { return nvml.Event{UUID: u, Type: nvml.EventDoubleBitECC} }, "double-bit ECC", false},
		{"double-bit ECC with Xid bits", nil, func(u string) nvml.Event {
			return nvml.Event{UUID: u, Type: nvml.EventDoubleBitECC | nvml.EventXidCritical, Data: 13}
		}, "double-bit ECC", false},
		{"default-ignored Xid 13", nil, xid(13), "", true},
		{"default-ignored Xid 31", nil, xid(31), "", true},
		{"default-ignored Xid 43", nil, xid(43), "", true},
		{"default-ignored Xid 45", nil, xid(45), "", true},
		{"default-ignored Xid 68", nil, xid(68), "", true},
		{"default-ignored Xid 109", nil, xid(109), "", true},
		{"own list: 79 ignored", &HealthConfig{Enabled: true, IgnoredXids: []int64{79}}, xid(79), "", true},
		{"own list replaces defaults: 13 critical", &HealthConfig{Enabled: true, IgnoredXids: []int64{79}}, xid(13), "Xid 13", false},
		{"empty list: 13 critical", &HealthConfig{Enabled: true, IgnoredXids: []int64{}}, xid(13), "Xid 13", false},
		{"single-bit ECC is not a failure", nil, func(u string) nvml.Event { return nvml.Event{UUID: u, Type: nvml.EventSingleBitECC} }, "", true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			lib := newFakeLib(3, "Tesla T4")
			devs := lib.Devices()
			cfg := testConfig(BackendNVML, "1h")
			cfg.Health = tc.health
			p := newPlugin(t, cfg, lib)
			ch := fingerprints(t, p)
			nextDevices(t, ch, wait)

			start := time.Now()
			lib.Inject(tc.event(devs[1].UUIDValue))
			if tc.ignored {
				// A critical event on another GPU, injected after: when its
				// fingerprint arrives the first event has been handled.
				lib.Inject(nvml.Event{UUID: devs[2].UUIDValue, Type: nvml.EventDoubleBitECC})
			}
			groups := nextDevices(t, ch, wait)
			if d := time.Since(start); d > time.Second {
				t.Errorf("re-fingerprint took %v; it must follow the event, not the period", d)
			}
			hit, _ := findDevice(groups, devs[1].UUIDValue)
			switch {
			case tc.ignored && !hit.Healthy:
				t.Errorf("ignored event made %s unhealthy: %q", hit.ID, hit.HealthDesc)
			case !tc.ignored && (hit.Healthy || !strings.Contains(hit.HealthDesc, tc.want)):
				t.Errorf("%s healthy=%v desc %q, want unhealthy saying %q", hit.ID, hit.Healthy, hit.HealthDesc, tc.want)
			}
			if d, _ := findDevice(groups, devs[0].UUIDValue); !d.Healthy {
				t.Errorf("bystander %s marked unhealthy: %q", d.ID, d.HealthDesc)
			}
			if tc.ignored {
				if d, _ := findDevice(groups, devs[2].UUIDValue); d.Healthy {
					t.Errorf("control event not seen")
				}
			}
		})
	}
}

func xid(n uint64) func(string) nvml.Event {
	return func(uuid string) nvml.Event { return nvml.Event{UUID: uuid, Type: nvml.EventXidCritical, Data: n} }
}

// TestXidStats: every Xid event is counted in the GPU's stats, an
// application's (ignored for health) too, and the last one's number kept.
func TestXidStats(t *testing.T) {
	lib := newFakeLib(2, "Tesla T4")
	devs := lib.Devices()
	p := newPlugin(t, testConfig(BackendNVML, "1h"), lib)
	ch := fingerprints(t, p)
	nextDevices(t, ch, wait)
	lib.Inject(xid(79)(devs[0].UUIDValue))
	awaitDevice(t, ch, devs[0].UUIDValue, func(d *device.Device) bool { return !d.Healthy })
	lib.Inject(xid(13)(devs[0].UUIDValue)) // ignored for health
	// A critical event on the other GPU, after: once it is seen, Xid 13 was handled.
	lib.Inject(xid(48)(devs[1].UUIDValue))
	awaitDevice(t, ch, devs[1].UUIDValue, func(d *device.Device) bool { return !d.Healthy })
	groups := p.collectStats(time.Unix(1700000000, 0))
	for uuid, want := range map[string][2]string{devs[0].UUIDValue: {"2 #", "13 "}, devs[1].UUIDValue: {"1 #", "48 "}} {
		at := instance(t, groups, uuid).Stats.Attributes
		if got := [2]string{statString(at[StatXidCount]), statString(at[StatXidLast])}; got != want {
			t.Errorf("%s: Xid count, last = %q, want %q", uuid, got, want)
		}
	}
}

// TestHealthEventSticky: an Xid mark survives later periods, though the
// counters NVML exposes show nothing wrong.
func TestHealthEventSticky(t *testing.T) {
	lib := newFakeLib(2, "Tesla T4")
	devs := lib.Devices()
	p := newPlugin(t, testConfig(BackendNVML, "20ms"), lib)
	ch := fingerprints(t, p)
	nextDevices(t, ch, wait)
	lib.Inject(xid(79)(devs[0].UUIDValue))
	awaitDevice(t, ch, devs[0].UUIDValue, func(d *device.Device) bool { return !d.Healthy })
	quiet(t, ch, 150*time.Millisecond) // several periods: still unhealthy, so no change to send
	if _, err := p.Reserve([]string{devs[0].UUIDValue}); err == nil || !strings.Contains(err.Error(), "Xid 79") {
		t.Errorf("Reserve of the GPU that raised Xid 79: %v", err)
	}
}

func TestHealthEventUnknownDevice(t *testing.T) {
	lib := newFakeLib(2, "Tesla T4")
	devs := lib.Devices()
	p := newPlugin(t, testConfig(BackendNVML, "1h"), lib)
	ch := fingerprints(t, p)
	nextDevices(t, ch, wait)
	lib.Inject(xid(79)("GPU-somebody-else"))
	quiet(t, ch, 100*time.Millisecond)
	lib.Inject(xid(79)(devs[1].UUIDValue))
	groups := awaitDevice(t, ch, devs[1].UUIDValue, func(d *device.Device) bool { return !d.Healthy })
	if d, _ := findDevice(groups, devs[0].UUIDValue); !d.Healthy {
		t.Errorf("an event for an unknown GPU hit %s", d.ID)
	}
}

func TestHealthDisabled(t *testing.T) {
	lib := newFakeLib(2, "Tesla T4")
	devs := lib.Devices()
	devs[0].Update(func(d *nvml.FakeDevice) { d.ECCUncorrected = 4 })
	cfg := testConfig(BackendNVML, "1h")
	cfg.Health = &HealthConfig{Enabled: false}
	p := newPlugin(t, cfg, lib)
	ch := fingerprints(t, p)
	groups := nextDevices(t, ch, wait)
	if d, _ := findDevice(groups, devs[0].UUIDValue); !d.Healthy {
		t.Errorf("health checks off, yet %s unhealthy: %q", d.ID, d.HealthDesc)
	}
	lib.Inject(xid(79)(devs[1].UUIDValue))
	quiet(t, ch, 100*time.Millisecond)
}

// TestHealthPolled: conditions NVML only exposes as counters are read every
// period.
func TestHealthPolled(t *testing.T) {
	cases := []struct {
		name string
		set  func(d *nvml.FakeDevice)
		want string
	}{
		{"uncorrectable ECC", func(d *nvml.FakeDevice) { d.ECCUncorrected = 2 }, "2 uncorrectable ECC error"},
		{"pending page retirement", func(d *nvml.FakeDevice) { d.PagesPending = true }, "retired memory pages are pending"},
		{"row remap failure", func(d *nvml.FakeDevice) { d.Rows.Failed = true }, "row remapping failed"},
		{"lost", func(d *nvml.FakeDevice) { d.Lost = true }, "NVML cannot read the GPU"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			lib := newFakeLib(3, "Tesla T4")
			devs := lib.Devices()
			p := newPlugin(t, testConfig(BackendNVML, "50ms"), lib)
			ch := fingerprints(t, p)
			for _, g := range nextDevices(t, ch, wait) {
				for _, d := range g.Devices {
					if !d.Healthy {
						t.Fatalf("%s unhealthy at start: %q", d.ID, d.HealthDesc)
					}
				}
			}
			devs[1].Update(tc.set)
			groups := nextDevices(t, ch, wait)
			if countDevices(groups) != 3 {
				t.Fatalf("a sick GPU must stay listed: %s", describeGroups(groups))
			}
			d, g := findDevice(groups, devs[1].UUIDValue)
			if d.Healthy || !strings.Contains(d.HealthDesc, tc.want) {
				t.Errorf("%s healthy=%v desc %q, want unhealthy saying %q", d.ID, d.Healthy, d.HealthDesc, tc.want)
			}
			if g.Name != "Tesla T4" || d.HwLocality == nil || d.HwLocality.PciBusID != devs[1].BusID {
				t.Errorf("sick GPU lost its group or locality: %q %+v", g.Name, d.HwLocality)
			}
			for _, other := range []*nvml.FakeDevice{devs[0], devs[2]} {
				if o, _ := findDevice(groups, other.UUIDValue); !o.Healthy {
					t.Errorf("bystander %s unhealthy: %q", o.ID, o.HealthDesc)
				}
			}
			if m := g.Attributes["memory"]; m == nil || *m.Int != 16384 {
				t.Errorf("group attributes changed: %s", attrString(g.Attributes))
			}
			quiet(t, ch, 200*time.Millisecond) // no flapping: the same state is not resent
		})
	}
}

// TestHealthLostAndBack: a lost GPU is unhealthy while NVML cannot read it
// and healthy again once it answers (after a reset).
func TestHealthLostAndBack(t *testing.T) {
	lib := newFakeLib(2, "Tesla T4")
	devs := lib.Devices()
	p := newPlugin(t, testConfig(BackendNVML, "20ms"), lib)
	ch := fingerprints(t, p)
	nextDevices(t, ch, wait)
	devs[0].Update(func(d *nvml.FakeDevice) { d.Lost = true })
	awaitDevice(t, ch, devs[0].UUIDValue, func(d *device.Device) bool { return !d.Healthy })
	devs[0].Update(func(d *nvml.FakeDevice) { d.Lost = false })
	awaitDevice(t, ch, devs[0].UUIDValue, func(d *device.Device) bool { return d.Healthy })
}

// TestHealthNeverIdentified: a GPU lost before its first fingerprint cannot
// be listed (its UUID is unknown); the others are.
func TestHealthNeverIdentified(t *testing.T) {
	lib := newFakeLib(3, "Tesla T4")
	devs := lib.Devices()
	devs[2].Update(func(d *nvml.FakeDevice) { d.Lost = true })
	groups := fingerprintOnce(t, newPlugin(t, testConfig(BackendNVML, "1h"), lib))
	if countDevices(groups) != 2 {
		t.Errorf("want the 2 readable GPUs: %s", describeGroups(groups))
	}
}

// TestHealthMIG: an event on a MIG-enabled GPU, or a failure its counters
// show, makes every instance on it unhealthy.
func TestHealthMIG(t *testing.T) {
	setup := func(t *testing.T, period string) (*nvml.FakeLibrary, []*nvml.FakeDevice, <-chan *device.FingerprintResponse) {
		lib := newFakeLib(2, "NVIDIA A100-SXM4-40GB")
		devs := lib.Devices()
		var insts []*nvml.FakeDevice
		for _, id := range []string{"MIG-1", "MIG-2"} {
			d := nvml.NewFakeDevice(nvml.FakeSpec{Model: "NVIDIA A100-SXM4-40GB MIG 3g.20gb", MemoryMiB: 19968}, 0)
			d.UUIDValue = id
			// NVML answers ECC and retirement queries on the GPU, not on MIG handles.
			for _, m := range []string{"ECCErrors", "RetiredPagesPending", "RemappedRows"} {
				d.Unsupported[m] = true
			}
			insts = append(insts, d)
		}
		devs[0].Update(func(d *nvml.FakeDevice) { d.MIG = insts })
		ch := fingerprints(t, newPlugin(t, testConfig(BackendNVML, period), lib))
		if n := countDevices(nextDevices(t, ch, wait)); n != 3 {
			t.Fatalf("want 2 MIG instances + 1 GPU, got %d", n)
		}
		return lib, devs, ch
	}
	check := func(t *testing.T, groups []*device.DeviceGroup, devs []*nvml.FakeDevice, want string) {
		t.Helper()
		for _, id := range []string{"MIG-1", "MIG-2"} {
			d, _ := findDevice(groups, id)
			if d == nil || d.Healthy || !strings.Contains(d.HealthDesc, want) {
				t.Errorf("MIG instance %s: %+v, want unhealthy saying %q", id, d, want)
			}
		}
		if d, _ := findDevice(groups, devs[1].UUIDValue); !d.Healthy {
			t.Errorf("the other GPU is unhealthy: %q", d.HealthDesc)
		}
	}
	t.Run("Xid on the parent", func(t *testing.T) {
		lib, devs, ch := setup(t, "1h")
		lib.Inject(xid(79)(devs[0].UUIDValue))
		check(t, nextDevices(t, ch, wait), devs, "Xid 79")
	})
	t.Run("uncorrectable ECC on the parent", func(t *testing.T) {
		_, devs, ch := setup(t, "20ms")
		devs[0].Update(func(d *nvml.FakeDevice) { d.ECCUncorrected = 1 })
		check(t, nextDevices(t, ch, wait), devs, "uncorrectable ECC")
	})
	t.Run("parent lost", func(t *testing.T) {
		_, devs, ch := setup(t, "20ms")
		devs[0].Update(func(d *nvml.FakeDevice) { d.Lost = true })
		// The loss may land between the inventory reading the GPU and the
		// health check asking it again: then the check says it, in its
		// words. Either way the instances are unhealthy because NVML lost it.
		groups := nextDevices(t, ch, wait)
		if d, _ := findDevice(groups, "MIG-1"); d != nil && strings.HasPrefix(d.HealthDesc, "NVML can no longer reach") {
			check(t, groups, devs, "NVML can no longer reach the GPU")
			return
		}
		check(t, groups, devs, "NVML cannot read")
	})
}

// eventLib is a FakeLibrary whose event set misbehaves.
type eventLib struct {
	*nvml.FakeLibrary
	createErr   error
	registerErr error
	waitErr     error
}

func (l *eventLib) NewEventSet() (nvml.EventSet, error) {
	if l.createErr != nil {
		return nil, l.createErr
	}
	return &eventSet{l: l}, nil
}

type eventSet struct{ l *eventLib }

func (s *eventSet) Register(nvml.Device, uint64) error { return s.l.registerErr }
func (s *eventSet) Free() error                        { return nil }
func (s *eventSet) Wait(time.Duration) (nvml.Event, error) {
	time.Sleep(time.Millisecond)
	return nvml.Event{}, s.l.waitErr
}

// TestHealthWithoutEvents: when NVML events cannot be had, the polled checks
// still work and the operator is told Xid checks are off.
func TestHealthWithoutEvents(t *testing.T) {
	cases := []struct {
		name string
		lib  func(*nvml.FakeLibrary) *eventLib
		log  string
	}{
		{"no event set", func(f *nvml.FakeLibrary) *eventLib {
			return &eventLib{FakeLibrary: f, createErr: errors.New("nvml EventSetCreate: insufficient permissions")}
		}, "Xid health checks disabled"},
		{"register fails", func(f *nvml.FakeLibrary) *eventLib {
			return &eventLib{FakeLibrary: f, registerErr: nvml.ErrNotSupported, waitErr: nvml.ErrTimeout}
		}, "cannot watch GPU events"},
		{"wait fails", func(f *nvml.FakeLibrary) *eventLib {
			return &eventLib{FakeLibrary: f, waitErr: errors.New("nvml EventSetWait: unknown error")}
		}, "Xid checks stop"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fake := newFakeLib(2, "Tesla T4")
			devs := fake.Devices()
			logger, logs := captureLogger()
			p := New(logger, func(string, nvml.FakeSpec) nvml.Library { return tc.lib(fake) })
			if err := p.SetConfig(encode(t, testConfig(BackendNVML, "20ms"))); err != nil {
				t.Fatal(err)
			}
			ch := fingerprints(t, p)
			if n := countDevices(nextDevices(t, ch, wait)); n != 2 {
				t.Fatalf("%d devices", n)
			}
			devs[0].Update(func(d *nvml.FakeDevice) { d.ECCUncorrected = 1 })
			groups := awaitDevice(t, ch, devs[0].UUIDValue, func(d *device.Device) bool { return !d.Healthy })
			if d, _ := findDevice(groups, devs[1].UUIDValue); !d.Healthy {
				t.Errorf("bystander unhealthy")
			}
			deadline := time.Now().Add(wait)
			for !strings.Contains(logs.String(), tc.log) && time.Now().Before(deadline) {
				time.Sleep(5 * time.Millisecond)
			}
			if !strings.Contains(logs.String(), tc.log) {
				t.Errorf("log does not say %q:\n%s", tc.log, logs)
			}
		})
	}
}
