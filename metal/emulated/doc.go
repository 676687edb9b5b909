// Package emulated holds the end-to-end test of the metal path on emulated hardware: a QEMU
// machine (TCG) with an empty disk, a NIC on a bridge and OpenIPMI's ipmi_sim as its external
// BMC, commissioned by a control plane and a real bcd site in a network namespace, booting bcd
// ramdisk (Debian's kernel and the project's initramfs) over PXE and iPXE, deployed, joined as a
// node, and released (docs/metal.md, "On emulated hardware"). The package has no code: only its
// test.
package emulated
