// Package siteagent is the metal module's half on a site agent (bcd site): the extension that
// converges the site's plan (the desired-state part siteapi.PlanKind) into the site's services,
// and carries out the control plane's BMC operations (the command kind metal.bmc) with the
// power drivers, the password arriving as the command's write-only secret. Reports go up
// through the agent's ext.Reporter.
package siteagent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/better-compute/compute/agent/ext"
	"github.com/better-compute/compute/metal/ipmi"
	"github.com/better-compute/compute/metal/power"
	"github.com/better-compute/compute/metal/redfish"
	"github.com/better-compute/compute/metal/siteapi"
)

// CommandBMC is the command kind of BMC operations (the metal module's metal.bmc).
const CommandBMC = power.Command

// Planner takes the site's plan: bcd site's services (bcd/internal/site).
type Planner interface {
	SetPlan(p siteapi.Plan) error
}

// Options configure the extension.
type Options struct {
	// Power are the power drivers by name; default ipmi and redfish (which accepts the
	// self-signed certificates most BMCs present: the site is on their network).
	Power map[string]power.Driver
}

// Extension returns the extension of a site agent whose services are planner.
func Extension(planner Planner, opts Options) ext.Extension {
	drivers := opts.Power
	if drivers == nil {
		drivers = map[string]power.Driver{"ipmi": ipmi.Driver{}, "redfish": redfish.Driver{Insecure: true}}
	}
	return ext.Extension{
		Name: "metal-site",
		Desired: map[string]ext.Converger{siteapi.PlanKind: func(_ context.Context, version uint32, payload []byte) error {
			if payload == nil {
				// No plan any more (the agent's pool left its site): serve nothing.
				return planner.SetPlan(siteapi.Plan{Unknown: siteapi.UnknownIgnore})
			}
			if version != siteapi.PlanVersion {
				return fmt.Errorf("%s version %d is not known to this bcd (it knows %d): upgrade it", siteapi.PlanKind, version, siteapi.PlanVersion)
			}
			var p siteapi.Plan
			if err := json.Unmarshal(payload, &p); err != nil {
				return fmt.Errorf("%s: %w", siteapi.PlanKind, err)
			}
			return planner.SetPlan(p)
		}},
		Commands: map[string]ext.Command{CommandBMC: func(ctx context.Context, args map[string]any) (map[string]any, error) {
			return runBMC(ctx, drivers, args)
		}},
	}
}

func runBMC(ctx context.Context, drivers map[string]power.Driver, args map[string]any) (map[string]any, error) {
	raw, _ := json.Marshal(args)
	var a power.CommandArgs
	if err := json.Unmarshal(raw, &a); err != nil {
		return nil, fmt.Errorf("metal.bmc: %w", err)
	}
	d, ok := drivers[a.Driver]
	if !ok {
		return nil, fmt.Errorf("metal.bmc: this site agent has no power driver %q", a.Driver)
	}
	var secret power.CommandSecret
	b := ext.SecretOf(ctx)
	if b == nil {
		return nil, errors.New("metal.bmc: the command carries no BMC password")
	}
	if err := json.Unmarshal(b, &secret); err != nil {
		return nil, fmt.Errorf("metal.bmc: the secret: %w", err)
	}
	out, err := power.Run(ctx, d, power.BMC{Address: a.Address, Username: a.Username, Password: secret.Password}, a.Ops)
	if err != nil {
		return nil, fmt.Errorf("machine %s: %w", a.Machine, err)
	}
	return map[string]any{"power": string(out.Power)}, nil
}
