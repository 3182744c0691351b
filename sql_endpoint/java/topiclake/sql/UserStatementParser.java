package topiclake.sql;

import org.apache.spark.sql.catalyst.FunctionIdentifier;
import org.apache.spark.sql.catalyst.TableIdentifier;
import org.apache.spark.sql.catalyst.expressions.Expression;
import org.apache.spark.sql.catalyst.parser.ParameterContext;
import org.apache.spark.sql.catalyst.parser.ParseException;
import org.apache.spark.sql.catalyst.parser.ParserInterface;
import org.apache.spark.sql.catalyst.plans.logical.LogicalPlan;
import org.apache.spark.sql.internal.SQLConf;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.StructType;
import scala.collection.immutable.Seq;

/**
 * The session's parser, with variable substitution off for every JDBC user's statement, whatever
 * the session set (a SET, or hiveconf: settings in the JDBC URL): `${env:...}`, `${spark:...}` and
 * `${hiveconf:...}` would otherwise put the server's environment and configuration, secrets
 * included, into a query's result or its error message. Before each statement, settings the JDBC
 * URL gave the session are put back to the server's (Access.revertSessionSettings).
 */
public final class UserStatementParser implements ParserInterface {
  private final Object session;
  private final ParserInterface delegate;

  public UserStatementParser(Object session, ParserInterface delegate) {
    this.session = session;
    this.delegate = delegate;
  }

  private boolean forClient() {
    return Access.user() != null || Access.isClientSession(session);
  }

  private void forUser() {
    if (forClient()) {
      SQLConf.get().setConfString("spark.sql.variable.substitute", "false");
    }
  }

  /** Before a statement (not each expression or view text parsed while one is analyzed). */
  private void forStatement() {
    if (forClient()) {
      SQLConf conf = SQLConf.get();
      Access.revertSessionSettings(conf);
      conf.setConfString("spark.sql.variable.substitute", "false");
    }
  }

  @Override
  public LogicalPlan parsePlan(String sql) throws ParseException {
    forStatement();
    return delegate.parsePlan(sql);
  }

  @Override
  public LogicalPlan parsePlanWithParameters(String sql, ParameterContext parameters) throws ParseException {
    forStatement();
    return delegate.parsePlanWithParameters(sql, parameters);
  }

  @Override
  public Expression parseExpression(String sql) throws ParseException {
    forUser();
    return delegate.parseExpression(sql);
  }

  @Override
  public TableIdentifier parseTableIdentifier(String sql) throws ParseException {
    forUser();
    return delegate.parseTableIdentifier(sql);
  }

  @Override
  public FunctionIdentifier parseFunctionIdentifier(String sql) throws ParseException {
    forUser();
    return delegate.parseFunctionIdentifier(sql);
  }

  @Override
  public Seq<String> parseMultipartIdentifier(String sql) throws ParseException {
    forUser();
    return delegate.parseMultipartIdentifier(sql);
  }

  @Override
  public LogicalPlan parseQuery(String sql) throws ParseException {
    forUser();
    return delegate.parseQuery(sql);
  }

  @Override
  public StructType parseRoutineParam(String sql) throws ParseException {
    forUser();
    return delegate.parseRoutineParam(sql);
  }

  @Override
  public StructType parseTableSchema(String sql) throws ParseException {
    forUser();
    return delegate.parseTableSchema(sql);
  }

  @Override
  public DataType parseDataType(String sql) throws ParseException {
    forUser();
    return delegate.parseDataType(sql);
  }
}
