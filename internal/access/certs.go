package access

import (
	"crypto/x509"
	"fmt"
	"slices"
	"strings"
)

// CertRule grants scopes to the verified client certificates it matches. It
// is one entry of the configuration file's auth.client_certificates list:
//
//	auth:
//	  client_certificates:
//	    - san: spiffe://cluster.local/ns/ray/sa/driver   # a URI, DNS, e-mail or IP SAN
//	      scopes: [select]
//	    - ou: kvselect-operators                          # an organizational unit of the subject
//	      scopes: [read, admin]
//
// Exactly one of SAN, OU and CN is set. The certificate must chain to the
// --tls-client-ca bundle; these rules only say what a verified one may do.
type CertRule struct {
	SAN    string   `json:"san,omitempty"`
	OU     string   `json:"ou,omitempty"`
	CN     string   `json:"cn,omitempty"`
	Scopes []string `json:"scopes"`
}

// CertRules is a checked list of CertRule.
type CertRules struct {
	rules  []CertRule
	scopes []Scopes
}

// NewCertRules checks the rules; errors name the rule by its index.
func NewCertRules(rules []CertRule) (*CertRules, error) {
	out := &CertRules{rules: slices.Clone(rules), scopes: make([]Scopes, len(rules))}
	for i, r := range rules {
		set := 0
		for _, v := range []string{r.SAN, r.OU, r.CN} {
			if v != "" {
				set++
			}
		}
		if set != 1 {
			return nil, fmt.Errorf("client_certificates[%d]: set exactly one of san, ou and cn", i)
		}
		if len(r.Scopes) == 0 {
			return nil, fmt.Errorf("client_certificates[%d]: scopes: name at least one of read, select, admin", i)
		}
		for _, name := range r.Scopes {
			sc, err := ParseScope(name)
			if err != nil {
				return nil, fmt.Errorf("client_certificates[%d]: scopes: %w", i, err)
			}
			out.scopes[i] |= Scopes(sc)
		}
	}
	return out, nil
}

// Len is the number of rules.
func (c *CertRules) Len() int { return len(c.rules) }

// Match returns the union of the scopes of every rule cert matches, and the
// identity to log: the subject's common name, else its first SAN.
func (c *CertRules) Match(cert *x509.Certificate) (Identity, Scopes, bool) {
	var scopes Scopes
	matched := false
	for i, r := range c.rules {
		if r.matches(cert) {
			scopes |= c.scopes[i]
			matched = true
		}
	}
	if !matched {
		return Identity{}, 0, false
	}
	return Identity{Method: "client-certificate", Subject: certName(cert)}, scopes, true
}

func (r *CertRule) matches(cert *x509.Certificate) bool {
	switch {
	case r.CN != "":
		return cert.Subject.CommonName == r.CN
	case r.OU != "":
		return slices.Contains(cert.Subject.OrganizationalUnit, r.OU)
	}
	return slices.Contains(certSANs(cert), r.SAN)
}

func certSANs(cert *x509.Certificate) []string {
	sans := slices.Clone(cert.DNSNames)
	sans = append(sans, cert.EmailAddresses...)
	for _, u := range cert.URIs {
		sans = append(sans, u.String())
	}
	for _, ip := range cert.IPAddresses {
		sans = append(sans, ip.String())
	}
	return sans
}

func certName(cert *x509.Certificate) string {
	if cert.Subject.CommonName != "" {
		return "CN=" + cert.Subject.CommonName
	}
	if sans := certSANs(cert); len(sans) > 0 {
		return "SAN=" + sans[0]
	}
	return "serial=" + strings.ToUpper(cert.SerialNumber.Text(16))
}
