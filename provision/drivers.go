package provision

// Driver is one implementation of a kind of driver (power: ipmi, redfish; boot: pxe;
// runtime: libvirt-kvm), registered by the module that provides it and used by the modules that
// compose drivers. Value is what the using module expects of that kind (an interface it
// defines, such as metal.BootDriver), so this package needs to know none of them.
type Driver struct {
	Kind, Name string
	Value      any
}

// Profile names a composition of drivers: one driver per kind, each registered
// (Catalog.Check).
type Profile struct {
	Name    string
	Drivers map[string]string // kind → driver name
}
