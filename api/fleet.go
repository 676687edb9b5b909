package api

import (
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"strings"
	"time"
)

// IAM resource types of the fleet groups.
const (
	ResourceSite = "compute-site"
	ResourcePool = "compute-pool"
	ResourceNode = "compute-node"
)

// Site is a place where nodes live: a datacenter, a room, a cloud region.
type Site struct {
	ID          string            `json:"id"`
	TenantID    string            `json:"tenantId"`
	Name        string            `json:"name"`
	DisplayName string            `json:"displayName,omitempty"`
	Labels      map[string]string `json:"labels"`
	CreatedAt   time.Time         `json:"createdAt"`
	UpdatedAt   time.Time         `json:"updatedAt"`
}

// Pool is a named set of nodes that capacity is requested from ("h100", "cpu-small").
type Pool struct {
	ID          string            `json:"id"`
	TenantID    string            `json:"tenantId"`
	SiteID      string            `json:"siteId,omitempty"`
	Name        string            `json:"name"`
	DisplayName string            `json:"displayName,omitempty"`
	Description string            `json:"description,omitempty"`
	Labels      map[string]string `json:"labels"`
	NodeCount   int               `json:"nodeCount"`
	Attestation PoolAttestation   `json:"attestation"`
	CreatedAt   time.Time         `json:"createdAt"`
	UpdatedAt   time.Time         `json:"updatedAt"`
}

// A pool's TPM attestation policies: what a machine's TPM must prove for it to join.
const (
	TPMOff      = "off"      // the default: TPM evidence is not looked at
	TPMOptional = "optional" // a machine may attest; what it sends must verify, and is recorded
	TPMRequired = "required" // a join without a TPM proof that verifies is refused
)

// Limits on a pool's EK roots.
const (
	MaxEKRoots     = 32
	MaxEKRootBytes = 16 << 10
)

// PoolAttestation is a pool's attestation policy (docs/nodes.md, "Attested joins").
type PoolAttestation struct {
	// TPM is off (the default), optional or required.
	TPM string `json:"tpm"`
	// EKRoots are PEM certificates of the CAs an EK certificate must chain to (a TPM
	// manufacturer's). None: an EK is trusted on first use, and pinned to the node it admitted.
	EKRoots []string `json:"ekRoots,omitempty"`
}

// Validate checks a policy, under field.
func (a PoolAttestation) Validate(field string) error {
	if err := ValidateEnum(field+".tpm", a.TPM, TPMOff, TPMOptional, TPMRequired); err != nil {
		return err
	}
	if len(a.EKRoots) > MaxEKRoots {
		return InvalidField(field+".ekRoots", "has %d certificates; the limit is %d", len(a.EKRoots), MaxEKRoots)
	}
	for i, root := range a.EKRoots {
		f := fmt.Sprintf("%s.ekRoots[%d]", field, i)
		if len(root) > MaxEKRootBytes {
			return InvalidField(f, "is %d bytes; the limit is %d", len(root), MaxEKRootBytes)
		}
		block, rest := pem.Decode([]byte(root))
		if block == nil || block.Type != "CERTIFICATE" || strings.TrimSpace(string(rest)) != "" {
			return InvalidField(f, "must be one PEM certificate (-----BEGIN CERTIFICATE-----)")
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return InvalidField(f, "does not parse: %v", err)
		}
		if !c.IsCA {
			return InvalidField(f, "%q is not a CA certificate; give the CA that issues the TPMs' EK certificates", c.Subject.String())
		}
	}
	return nil
}

// WithDefaults returns the policy with its zero fields filled: tpm off, no roots.
func (a PoolAttestation) WithDefaults() PoolAttestation {
	if a.TPM == "" {
		a.TPM = TPMOff
	}
	if a.EKRoots == nil {
		a.EKRoots = []string{}
	}
	return a
}

// Node lifecycle states.
const (
	NodeActive   = "active"
	NodeCordoned = "cordoned" // no new bookings
	NodeDraining = "draining" // no new bookings; existing ones are being ended
	NodeRetired  = "retired"
)

// Node session statuses.
const (
	NodeOnline  = "online"
	NodeOffline = "offline"
)

// Node roles: what a machine joined as. A site agent (bcd site) is a node of role site: it holds
// a session like any node, but offers no capacity (its inventory is not recorded) and is the only
// kind of node given the secrets of the machines at its pool's site.
const (
	RoleNode = "node"
	RoleSite = "site"
)

// Health values, of nodes and devices.
const (
	HealthUnknown   = "unknown"
	HealthHealthy   = "healthy"
	HealthDegraded  = "degraded"
	HealthUnhealthy = "unhealthy"
)

// Node is one server that runs bcd.
type Node struct {
	ID         string            `json:"id"`
	TenantID   string            `json:"tenantId"`
	PoolID     string            `json:"poolId"`
	Name       string            `json:"name"`
	Role       string            `json:"role"`   // node, or site for a site agent
	State      string            `json:"state"`  // active, cordoned, draining, retired
	Status     string            `json:"status"` // online, offline
	Health     string            `json:"health"` // unknown, healthy, degraded, unhealthy
	Labels     map[string]string `json:"labels"`
	LastSeenAt *time.Time        `json:"lastSeenAt,omitempty"`
	CreatedAt  time.Time         `json:"createdAt"`
	UpdatedAt  time.Time         `json:"updatedAt"`
}

// CreateSite is the input of sites.create.
type CreateSite struct {
	TenantID    string            `json:"tenantId,omitempty"` // default: the caller's tenant
	Name        string            `json:"name"`
	DisplayName string            `json:"displayName,omitempty"`
	Labels      map[string]string `json:"labels,omitempty"`
}

// Validate implements the input check of sites.create.
func (in CreateSite) Validate() error {
	return first(ValidateName("name", in.Name), ValidateText("displayName", in.DisplayName, MaxDisplayName),
		ValidateLabels("labels", in.Labels))
}

// GetSite is the input of sites.get.
type GetSite struct {
	TenantID string `json:"tenantId,omitempty"` // where to look a name up; default: the caller's tenant
	Site     string `json:"site"`               // id or name
}

// Validate implements the input check of sites.get.
func (in GetSite) Validate() error { return ValidateRef("site", in.Site) }

// ListSites is the input of sites.list.
type ListSites struct {
	TenantID string `json:"tenantId,omitempty"`
	PageRequest
}

// UpdateSite is the input of sites.update. Nil fields are left as they are; Labels, when set,
// replaces the whole map.
type UpdateSite struct {
	TenantID    string             `json:"tenantId,omitempty"`
	Site        string             `json:"site"`
	DisplayName *string            `json:"displayName,omitempty"`
	Labels      *map[string]string `json:"labels,omitempty"`
}

// Validate implements the input check of sites.update.
func (in UpdateSite) Validate() error {
	err := ValidateRef("site", in.Site)
	if err == nil && in.DisplayName != nil {
		err = ValidateText("displayName", *in.DisplayName, MaxDisplayName)
	}
	if err == nil && in.Labels != nil {
		err = ValidateLabels("labels", *in.Labels)
	}
	return err
}

// DeleteSite is the input of sites.delete. A site that still has pools cannot be deleted.
type DeleteSite struct {
	TenantID string `json:"tenantId,omitempty"`
	Site     string `json:"site"`
}

// Validate implements the input check of sites.delete.
func (in DeleteSite) Validate() error { return ValidateRef("site", in.Site) }

// CreatePool is the input of pools.create.
type CreatePool struct {
	TenantID    string            `json:"tenantId,omitempty"`
	Name        string            `json:"name"`
	Site        string            `json:"site,omitempty"` // id or name of a site of the same tenant
	DisplayName string            `json:"displayName,omitempty"`
	Description string            `json:"description,omitempty"`
	Labels      map[string]string `json:"labels,omitempty"`
	Attestation *PoolAttestation  `json:"attestation,omitempty"` // default: tpm off
}

// Validate implements the input check of pools.create.
func (in CreatePool) Validate() error {
	err := first(ValidateName("name", in.Name), ValidateText("displayName", in.DisplayName, MaxDisplayName),
		ValidateText("description", in.Description, MaxDescription), ValidateLabels("labels", in.Labels))
	if err == nil && in.Attestation != nil {
		err = in.Attestation.Validate("attestation")
	}
	return err
}

// GetPool is the input of pools.get.
type GetPool struct {
	TenantID string `json:"tenantId,omitempty"`
	Pool     string `json:"pool"` // id or name
}

// Validate implements the input check of pools.get.
func (in GetPool) Validate() error { return ValidateRef("pool", in.Pool) }

// ListPools is the input of pools.list.
type ListPools struct {
	TenantID string `json:"tenantId,omitempty"`
	Site     string `json:"site,omitempty"` // only the pools of this site (id or name)
	PageRequest
}

// UpdatePool is the input of pools.update. Nil fields are left as they are.
type UpdatePool struct {
	TenantID    string             `json:"tenantId,omitempty"`
	Pool        string             `json:"pool"`
	DisplayName *string            `json:"displayName,omitempty"`
	Description *string            `json:"description,omitempty"`
	Labels      *map[string]string `json:"labels,omitempty"`
	// Attestation, when set, replaces the whole policy. It applies to joins from then on; the
	// pool's nodes stay.
	Attestation *PoolAttestation `json:"attestation,omitempty"`
}

// Validate implements the input check of pools.update.
func (in UpdatePool) Validate() error {
	err := ValidateRef("pool", in.Pool)
	if err == nil && in.DisplayName != nil {
		err = ValidateText("displayName", *in.DisplayName, MaxDisplayName)
	}
	if err == nil && in.Description != nil {
		err = ValidateText("description", *in.Description, MaxDescription)
	}
	if err == nil && in.Labels != nil {
		err = ValidateLabels("labels", *in.Labels)
	}
	if err == nil && in.Attestation != nil {
		err = in.Attestation.Validate("attestation")
	}
	return err
}

// DeletePool is the input of pools.delete. A pool that still has nodes cannot be deleted.
type DeletePool struct {
	TenantID string `json:"tenantId,omitempty"`
	Pool     string `json:"pool"`
}

// Validate implements the input check of pools.delete.
func (in DeletePool) Validate() error { return ValidateRef("pool", in.Pool) }

// GetNode is the input of nodes.get.
type GetNode struct {
	TenantID string `json:"tenantId,omitempty"`
	Node     string `json:"node"` // id, or name when Pool is given
	Pool     string `json:"pool,omitempty"`
}

// Validate implements the input check of nodes.get.
func (in GetNode) Validate() error { return ValidateRef("node", in.Node) }

// ListNodes is the input of nodes.list.
type ListNodes struct {
	TenantID string `json:"tenantId,omitempty"`
	Pool     string `json:"pool,omitempty"`  // only the nodes of this pool (id or name)
	State    string `json:"state,omitempty"` // only nodes in this state
	Role     string `json:"role,omitempty"`  // only nodes of this role (node, site)
	PageRequest
}

// Validate implements the input check of nodes.list.
func (in ListNodes) Validate() error {
	return first(ValidateEnum("state", in.State, NodeActive, NodeCordoned, NodeDraining, NodeRetired),
		ValidateEnum("role", in.Role, RoleNode, RoleSite), in.PageRequest.Validate())
}
