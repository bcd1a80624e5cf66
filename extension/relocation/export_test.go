package relocation

// DropInbound makes d's relocation actor drop every message drop reports
// true for, as a cut link would (nil: drop nothing).
func DropInbound(d *Driver, drop func(any) bool) {
	if drop == nil {
		d.dropInbound.Store(nil)
		return
	}
	d.dropInbound.Store(&drop)
}
