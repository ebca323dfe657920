package nvml

import (
	"errors"
	"strings"
	"testing"
)

func TestCheckHealth(t *testing.T) {
	cases := []struct {
		name string
		set  func(d *FakeDevice)
		want string // substring of the reason; "" means healthy
	}{
		{"healthy", func(*FakeDevice) {}, ""},
		{"corrected ECC errors only", func(d *FakeDevice) { d.ECCCorrected = 1000 }, ""},
		{"uncorrected ECC", func(d *FakeDevice) { d.ECCUncorrected = 3 }, "3 uncorrectable ECC error"},
		{"pages pending retirement", func(d *FakeDevice) { d.PagesPending = true }, "retired memory pages are pending"},
		{"row remap failed", func(d *FakeDevice) { d.Rows.Failed = true }, "row remapping failed"},
		{"rows remapped fine", func(d *FakeDevice) { d.Rows = RemappedRows{Correctable: 2, Uncorrectable: 1} }, ""},
		{"lost", func(d *FakeDevice) { d.Lost = true }, "no longer reach"},
		{"nothing supported (consumer card)", func(d *FakeDevice) {
			d.ECCUncorrected, d.PagesPending, d.Rows.Failed = 9, true, true // values unreadable
			for _, m := range []string{"ECCErrors", "RetiredPagesPending", "RemappedRows"} {
				d.Unsupported[m] = true
			}
		}, ""},
		{"ECC query failing is not a failure", func(d *FakeDevice) {
			d.ECCUncorrected = 9
			d.Failing = map[string]error{"ECCErrors": errors.New("nvml: unknown error")}
		}, ""},
		{"no ECC but row remap failed", func(d *FakeDevice) {
			d.Unsupported["ECCErrors"] = true
			d.Rows.Failed = true
		}, "row remapping failed"},
		{"no retired-pages query (Ampere+) but row remap failed", func(d *FakeDevice) {
			d.Unsupported["RetiredPagesPending"] = true
			d.Rows.Failed = true
		}, "row remapping failed"},
		{"ECC reported before pages", func(d *FakeDevice) { d.ECCUncorrected, d.PagesPending = 1, true }, "uncorrectable ECC"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d := NewFakeDevice(FakeSpec{Model: "NVIDIA A100-SXM4-80GB", MemoryMiB: 81920}, 0)
			d.Update(tc.set)
			got := CheckHealth(d)
			switch {
			case tc.want == "" && got != "":
				t.Errorf("CheckHealth = %q, want healthy", got)
			case tc.want != "" && !strings.Contains(got, tc.want):
				t.Errorf("CheckHealth = %q, want it to say %q", got, tc.want)
			}
		})
	}
}

func TestXidDescription(t *testing.T) {
	cases := map[uint64]string{
		79:  "Xid 79 (GPU has fallen off the bus)",
		48:  "Xid 48 (double-bit ECC error)",
		13:  "Xid 13 (graphics engine exception)",
		999: "Xid 999",
		0:   "Xid 0",
	}
	for xid, want := range cases {
		if got := XidDescription(xid); got != want {
			t.Errorf("XidDescription(%d) = %q, want %q", xid, got, want)
		}
	}
}
