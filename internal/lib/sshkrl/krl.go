// Package sshkrl writes OpenSSH key revocation lists (KRLs): what sshd's RevokedKeys reads. The
// control plane makes them (internal/core/access); bcd writes an empty one where it has none.
package sshkrl

import (
	"encoding/binary"
	"slices"
	"time"

	"golang.org/x/crypto/ssh"
)

// Write writes an OpenSSH key revocation list (PROTOCOL.krl in OpenSSH's source) that revokes
// certificates by serial, per certificate authority: what sshd's RevokedKeys reads. x/crypto/ssh
// has no KRL writer, and the format's certificate-serial part is a few lines; the tests check
// that OpenSSH's own ssh-keygen and sshd read it.
func Write(version uint64, generated time.Time, revoked []Revoked) []byte {
	var out []byte
	out = binary.BigEndian.AppendUint64(out, krlMagic)
	out = binary.BigEndian.AppendUint32(out, krlFormatVersion)
	out = binary.BigEndian.AppendUint64(out, version)
	out = binary.BigEndian.AppendUint64(out, uint64(generated.Unix()))
	out = binary.BigEndian.AppendUint64(out, 0) // flags
	out = appendString(out, nil)                // reserved
	out = appendString(out, []byte("better-compute"))
	// In a fixed order: the same revocations give the same bytes.
	revoked = slices.Clone(revoked)
	slices.SortFunc(revoked, func(a, b Revoked) int { return slices.Compare(a.CA.Marshal(), b.CA.Marshal()) })
	for _, r := range revoked {
		ca := r.CA
		serials := slices.Clone(r.Serials)
		slices.Sort(serials)
		serials = slices.Compact(serials)
		if len(serials) == 0 {
			continue
		}
		var list []byte
		for _, s := range serials {
			list = binary.BigEndian.AppendUint64(list, s)
		}
		var section []byte
		section = appendString(section, ca.Marshal())
		section = appendString(section, nil) // reserved
		section = append(section, krlCertSerialList)
		section = appendString(section, list)
		out = append(out, krlSectionCertificates)
		out = appendString(out, section)
	}
	return out
}

// Revoked are the certificates of one certificate authority revoked by serial.
type Revoked struct {
	CA      ssh.PublicKey
	Serials []uint64
}

const (
	krlMagic               = 0x5353484b524c0a00 // "SSHKRL\n\0"
	krlFormatVersion       = 1
	krlSectionCertificates = 1
	krlCertSerialList      = 0x20
)

func appendString(b, s []byte) []byte {
	b = binary.BigEndian.AppendUint32(b, uint32(len(s)))
	return append(b, s...)
}
