//! The control plane's certificates, made in process: a CA; kube-apiserver's serving
//! certificate for 127.0.0.1 and `localhost`, signed by it; client certificates for any user and
//! groups, signed by it (kube-apiserver's `--client-ca-file` authenticates them: the common name
//! is the user, each organisation a group); and the service-account signing key.

use std::net::{IpAddr, Ipv4Addr};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose, SanType,
};

/// A certificate and its private key, both PEM.
#[derive(Clone, Debug)]
pub(crate) struct Pair {
    pub(crate) cert_pem: String,
    pub(crate) key_pem: String,
}

/// The CA that signs the serving and client certificates.
pub(crate) struct Authority {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

impl std::fmt::Debug for Authority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authority").finish_non_exhaustive()
    }
}

impl Authority {
    pub(crate) fn new() -> Result<Self, rcgen::Error> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, "workqueue-e2e-ca");
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate()?)?;
        Ok(Authority { issuer })
    }

    /// The CA certificate, PEM (kube-apiserver's `--client-ca-file`).
    pub(crate) fn cert_pem(&self) -> String {
        self.issuer.pem()
    }

    /// The CA certificate, DER (the clients' root).
    pub(crate) fn cert_der(&self) -> Vec<u8> {
        self.issuer.der().to_vec()
    }

    /// kube-apiserver's serving certificate: 127.0.0.1 and `localhost`.
    pub(crate) fn serving(&self) -> Result<Pair, rcgen::Error> {
        let mut params = CertificateParams::new(vec!["localhost".to_string()])?;
        params
            .subject_alt_names
            .push(SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)));
        params
            .distinguished_name
            .push(DnType::CommonName, "kube-apiserver");
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        self.sign(params)
    }

    /// A client certificate: `user` as the common name, `group` (if any) as the organisation.
    /// (rcgen keeps one value per attribute type: one group at most, besides the
    /// `system:authenticated` that every user has.)
    pub(crate) fn client(&self, user: &str, group: Option<&str>) -> Result<Pair, rcgen::Error> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name.push(DnType::CommonName, user);
        if let Some(group) = group {
            params
                .distinguished_name
                .push(DnType::OrganizationName, group);
        }
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        self.sign(params)
    }

    fn sign(&self, params: CertificateParams) -> Result<Pair, rcgen::Error> {
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok(Pair {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}

/// The service-account token signing key (ECDSA P-256): the private key (PKCS#8 PEM, for
/// `--service-account-signing-key-file`) and the public key (PEM, for
/// `--service-account-key-file`, which does not read a PKCS#8 private key).
pub(crate) fn service_account_key() -> Result<Pair, rcgen::Error> {
    let key = KeyPair::generate()?;
    Ok(Pair {
        cert_pem: key.public_key_pem(),
        key_pem: key.serialize_pem(),
    })
}
