package topiclake.sql;

import javax.security.sasl.AuthenticationException;
import org.apache.hive.service.auth.PasswdAuthenticationProvider;

/**
 * hive.server2.authentication=CUSTOM: the JDBC user is an API key's principal and the password is
 * the key, as over Kafka's SASL/PLAIN. Hive makes a new instance for every login.
 */
public class KeyAuthentication implements PasswdAuthenticationProvider {
  public KeyAuthentication() {}

  @Override
  public void Authenticate(String user, String password) throws AuthenticationException {
    if (user == null || password == null || !Access.authenticates(user, password)) {
      throw new AuthenticationException(
          "Unknown principal or API key: the JDBC user is the key's principal and the password is the key.");
    }
  }
}
