package power

// Command is the command kind with which the control plane has a site agent carry out operations
// on a BMC of its site: the metal module registers it, metal/siteagent runs it. Both sides take its
// types from here, so that they are written once.
const Command = "metal.bmc"

// CommandArgs are the arguments of a Command; the password travels as its write-only secret,
// CommandSecret.
type CommandArgs struct {
	Machine  string `json:"machine"`
	Driver   string `json:"driver"`
	Address  string `json:"address"`
	Username string `json:"username"`
	Ops      []Op   `json:"ops"`
}

// CommandSecret is a Command's secret.
type CommandSecret struct {
	Password string `json:"password"`
}
