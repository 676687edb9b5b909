package sshkrl

import (
	"bytes"
	"crypto/sha1"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"math/big"

	"golang.org/x/crypto/ssh"
)

// KRL is a key revocation list read back: what a guest that serves SSH with x/crypto/ssh checks
// a certificate against, as sshd's RevokedKeys does. x/crypto/ssh has no KRL reader either.
type KRL struct {
	Version uint64 // the list's own version number
	certs   []certRevocations
	keys    map[string]bool // plain key blobs
	sha1    map[[sha1.Size]byte]bool
	sha256  map[[sha256.Size]byte]bool
}

// certRevocations are one certificate section's: the certificates of one CA (any CA when ca is
// nil) revoked by serial or by key id.
type certRevocations struct {
	ca      []byte // the CA's public key blob
	serials map[uint64]bool
	ranges  [][2]uint64
	keyIDs  map[string]bool
}

const (
	krlSectionExplicitKey = 2
	krlSectionSHA1        = 3
	krlSectionSignature   = 4
	krlSectionSHA256      = 5
	krlCertSerialRange    = 0x21
	krlCertSerialBitmap   = 0x22
	krlCertKeyID          = 0x23
)

// Parse reads an OpenSSH KRL (PROTOCOL.krl): every section OpenSSH writes, certificates by
// serial, serial range, serial bitmap and key id, per CA or for any CA, and keys by blob, SHA-1
// or SHA-256. A list it cannot read whole is an error, never a shorter list; so is a signed one
// (OpenSSH no longer writes or checks KRL signatures).
func Parse(b []byte) (*KRL, error) {
	r := reader{b: b}
	if r.uint64() != krlMagic {
		return nil, errors.New("sshkrl: not a KRL (its magic number)")
	}
	if v := r.uint32(); v != krlFormatVersion {
		return nil, fmt.Errorf("sshkrl: KRL format version %d, not %d", v, krlFormatVersion)
	}
	k := &KRL{Version: r.uint64(), keys: map[string]bool{}, sha1: map[[sha1.Size]byte]bool{}, sha256: map[[sha256.Size]byte]bool{}}
	r.uint64() // generated date
	r.uint64() // flags
	r.string() // reserved
	r.string() // comment
	for r.err == nil && len(r.b) > 0 {
		kind := r.byte()
		data := reader{b: r.string()}
		if r.err != nil {
			break
		}
		switch kind {
		case krlSectionCertificates:
			c, err := parseCertSection(data)
			if err != nil {
				return nil, err
			}
			k.certs = append(k.certs, c)
		case krlSectionExplicitKey:
			for data.err == nil && len(data.b) > 0 {
				k.keys[string(data.string())] = true
			}
		case krlSectionSHA1:
			for data.err == nil && len(data.b) > 0 {
				h := data.string()
				if len(h) != sha1.Size {
					return nil, errors.New("sshkrl: a SHA-1 of the wrong length")
				}
				k.sha1[[sha1.Size]byte(h)] = true
			}
		case krlSectionSHA256:
			for data.err == nil && len(data.b) > 0 {
				h := data.string()
				if len(h) != sha256.Size {
					return nil, errors.New("sshkrl: a SHA-256 of the wrong length")
				}
				k.sha256[[sha256.Size]byte(h)] = true
			}
		case krlSectionSignature:
			return nil, errors.New("sshkrl: a signed KRL is not read here")
		default:
			return nil, fmt.Errorf("sshkrl: unknown KRL section %d", kind)
		}
		if data.err != nil {
			return nil, data.err
		}
	}
	if r.err != nil {
		return nil, r.err
	}
	return k, nil
}

func parseCertSection(r reader) (certRevocations, error) {
	c := certRevocations{ca: r.string(), serials: map[uint64]bool{}, keyIDs: map[string]bool{}}
	r.string() // reserved
	for r.err == nil && len(r.b) > 0 {
		kind := r.byte()
		data := reader{b: r.string()}
		if r.err != nil {
			break
		}
		switch kind {
		case krlCertSerialList:
			for data.err == nil && len(data.b) > 0 {
				c.serials[data.uint64()] = true
			}
		case krlCertSerialRange:
			lo, hi := data.uint64(), data.uint64()
			if lo > hi {
				return c, fmt.Errorf("sshkrl: a serial range %d-%d", lo, hi)
			}
			c.ranges = append(c.ranges, [2]uint64{lo, hi})
		case krlCertSerialBitmap:
			offset := data.uint64()
			bits := new(big.Int).SetBytes(data.string()) // an mpint, never negative here
			for i := range bits.BitLen() {
				if bits.Bit(i) == 1 {
					c.serials[offset+uint64(i)] = true
				}
			}
		case krlCertKeyID:
			for data.err == nil && len(data.b) > 0 {
				c.keyIDs[string(data.string())] = true
			}
		default:
			return c, fmt.Errorf("sshkrl: unknown certificate section %#x", kind)
		}
		if data.err == nil && len(data.b) > 0 {
			data.err = errors.New("sshkrl: trailing bytes in a certificate section")
		}
		if data.err != nil {
			return c, data.err
		}
	}
	return c, r.err
}

// IsRevoked reports whether the list revokes key, as sshd checks it: a plain key by its blob or
// hash; a certificate by its own key, its CA's key, or by serial or key id under its CA.
func (k *KRL) IsRevoked(key ssh.PublicKey) bool {
	cert, isCert := key.(*ssh.Certificate)
	if !isCert {
		return k.keyRevoked(key)
	}
	if k.keyRevoked(cert.Key) || k.keyRevoked(cert.SignatureKey) {
		return true
	}
	ca := cert.SignatureKey.Marshal()
	for _, c := range k.certs {
		if len(c.ca) > 0 && !bytes.Equal(c.ca, ca) {
			continue
		}
		if c.keyIDs[cert.KeyId] {
			return true
		}
		if cert.Serial == 0 {
			continue // no serial: OpenSSH ignores serial 0, the default of a CA that gives none
		}
		if c.serials[cert.Serial] {
			return true
		}
		for _, rg := range c.ranges {
			if cert.Serial >= rg[0] && cert.Serial <= rg[1] {
				return true
			}
		}
	}
	return false
}

func (k *KRL) keyRevoked(key ssh.PublicKey) bool {
	blob := key.Marshal()
	return k.keys[string(blob)] || k.sha1[sha1.Sum(blob)] || k.sha256[sha256.Sum256(blob)]
}

// reader reads the SSH wire encoding; its first error sticks, and every read after it is zero.
type reader struct {
	b   []byte
	err error
}

func (r *reader) take(n int) []byte {
	if r.err != nil {
		return nil
	}
	if n < 0 || n > len(r.b) {
		r.err = errors.New("sshkrl: the KRL is cut short")
		return nil
	}
	out := r.b[:n]
	r.b = r.b[n:]
	return out
}

func (r *reader) byte() byte {
	if b := r.take(1); b != nil {
		return b[0]
	}
	return 0
}

func (r *reader) uint32() uint32 {
	if b := r.take(4); b != nil {
		return binary.BigEndian.Uint32(b)
	}
	return 0
}

func (r *reader) uint64() uint64 {
	if b := r.take(8); b != nil {
		return binary.BigEndian.Uint64(b)
	}
	return 0
}

func (r *reader) string() []byte {
	n := r.uint32()
	if r.err != nil {
		return nil
	}
	if uint64(n) > uint64(len(r.b)) {
		r.err = errors.New("sshkrl: the KRL is cut short")
		return nil
	}
	return r.take(int(n))
}
